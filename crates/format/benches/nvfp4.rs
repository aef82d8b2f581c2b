//! Quantize+pack and unpack+dequantize throughput on a 4096x4096 bf16 weight, on one thread and
//! on all threads. Throughput is reported in bytes of bf16 (input for quantize, output for
//! dequantize), the unit of the bars.
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use fp4forge_format::{dequantize_bf16_into, quantize, Nvfp4View, SourceDtype, WeightView};

const N: usize = 4096;

fn weight_bytes() -> Vec<u8> {
    // Deterministic pseudo-normal-ish values (xorshift), bf16 little endian.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..N * N)
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
            fp4forge_format::float::f32_to_bf16_bits(u * u * u * 8.0).to_le_bytes()
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let bytes = weight_bytes();
    let weight = WeightView::new("bench", SourceDtype::Bf16, N, N, &bytes).expect("shape");
    let quantized = quantize(&weight).expect("quantize");
    let view = Nvfp4View::of(&quantized);
    let all = rayon::current_num_threads();
    let single = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("pool");

    let mut group = c.benchmark_group("nvfp4_4096x4096_bf16");
    group.throughput(Throughput::Bytes((N * N * 2) as u64));
    group.sample_size(10);
    group.bench_function("quantize/1-thread", |b| {
        b.iter(|| single.install(|| quantize(&weight).expect("quantize")))
    });
    group.bench_function(format!("quantize/{all}-threads"), |b| {
        b.iter(|| quantize(&weight).expect("quantize"))
    });
    let mut out = vec![0u16; N * N];
    group.bench_function("dequantize_bf16/1-thread", |b| {
        b.iter(|| single.install(|| dequantize_bf16_into(&view, &mut out)))
    });
    group.bench_function(format!("dequantize_bf16/{all}-threads"), |b| {
        b.iter(|| dequantize_bf16_into(&view, &mut out))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
