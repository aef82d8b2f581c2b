//! GEMV throughput (one token, `y = x · Wᵀ`) of the CPU backend for bf16 and NVFP4 weights at
//! SmolLM2's MLP shape (1536×576 and 576×1536) and at 4096×4096. Throughput is reported in bytes
//! of weights streamed per second, the figure that bounds decode speed.
//!
//! `cargo bench -p fp4forge-engine --bench gemv`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use fp4forge_engine::backend::cpu::CpuBackend;
use fp4forge_engine::{Backend, LinearWeight};
use fp4forge_format::{quantize, SourceDtype, WeightView};

fn weights(rows: usize, cols: usize) -> (LinearWeight, LinearWeight) {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let bits: Vec<u16> = (0..rows * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32;
            half::bf16::from_f32((u - 0.5) * 0.1).to_bits()
        })
        .collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let view = WeightView::new("w", SourceDtype::Bf16, rows, cols, &bytes).expect("shape");
    let q = quantize(&view).expect("quantize");
    (
        LinearWeight::from_bf16_bits(rows, cols, &bits),
        LinearWeight::from_nvfp4(&q, None),
    )
}

fn gemv(c: &mut Criterion) {
    let backend = CpuBackend::new();
    let mut group = c.benchmark_group("gemv");
    for (rows, cols) in [(1536usize, 576usize), (576, 1536), (4096, 4096)] {
        let (bf16, nvfp4) = weights(rows, cols);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
            .collect();
        let x = backend.upload(1, cols, &x).expect("upload");
        for (kind, w) in [("bf16", bf16), ("nvfp4", nvfp4)] {
            let bytes = w.stored_bytes() as u64;
            let w = backend.load_linear("w", w).expect("load");
            group.throughput(Throughput::Bytes(bytes));
            group.bench_with_input(
                BenchmarkId::new(kind, format!("{rows}x{cols}")),
                &(),
                |b, _| b.iter(|| backend.linear(&x, &w, None).expect("linear")),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, gemv);
criterion_main!(benches);
