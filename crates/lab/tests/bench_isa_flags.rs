//! `benches/cpu_vs_llamacpp.sh` builds llama.cpp for the CPU it runs on: the ggml ISA options it
//! passes to cmake follow the flags `/proc/cpuinfo` reports (an AVX-512 build dies with SIGILL on
//! an AVX2-only CPU). Checked on an AVX2-only and an AVX-512 cpuinfo through the script's
//! `ISA_FLAGS_ONLY=1` mode.

use std::path::Path;
use std::process::Command;

/// The `flags` line of an AMD EPYC with AVX2 but no AVX-512 (Zen 2/3).
const EPYC_AVX2: &str = "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 \
clflush mmx fxsr sse sse2 ht syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good \
nopl nonstop_tsc cpuid extd_apicid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 \
sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm cmp_legacy cr8_legacy \
abm sse4a misalignsse 3dnowprefetch osvw topoext perfctr_core invpcid_single ssbd ibrs ibpb \
stibp vmmcall fsgsbase tsc_adjust bmi1 avx2 smep bmi2 erms invpcid rdseed adx smap clflushopt \
clwb sha_ni xsaveopt xsavec xgetbv1 xsaves clzero xsaveerptr rdpru wbnoinvd arat npt nrip_save \
umip rdpid";

/// The extra `flags` of an AVX-512 CPU (Zen 4 / Ice Lake and later).
const AVX512: &str = "avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 \
avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq";

fn isa_flags(flags: &str) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let cpuinfo = tmp.path().join("cpuinfo");
    let text = format!(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n\
         processor\t: 1\nflags\t\t: {flags}\n"
    );
    std::fs::write(&cpuinfo, text).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../benches/cpu_vs_llamacpp.sh");
    let out = Command::new("bash")
        .arg(&script)
        .env("ISA_FLAGS_ONLY", "1")
        .env("CPUINFO", &cpuinfo)
        .env("WORK", tmp.path().join("work"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn an_avx2_only_cpu_gets_no_avx512_build() {
    let flags = isa_flags(EPYC_AVX2);
    for on in ["AVX", "AVX2", "FMA", "F16C"] {
        assert!(flags.contains(&format!("-DGGML_{on}=ON ")), "{on}: {flags}");
    }
    assert!(flags.contains("-DGGML_AVX512=OFF"), "{flags}");
}

#[test]
fn an_avx512_cpu_gets_the_avx512_build() {
    let flags = isa_flags(&format!("{EPYC_AVX2} {AVX512}"));
    assert!(flags.contains("-DGGML_AVX512=ON"), "{flags}");
    // avx512f alone is not what ggml's GGML_AVX512 compiles for (it adds cd/vl/dq/bw)
    let flags = isa_flags(&format!("{EPYC_AVX2} avx512f"));
    assert!(flags.contains("-DGGML_AVX512=OFF"), "{flags}");
}
