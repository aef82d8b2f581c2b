#!/usr/bin/env bash
# fp4forge's CUDA engine, served (`fp4forge serve --device cuda`), vs llama.cpp (CUDA build of
# llama-bench and llama-batched-bench) on one GPU, on the synthetic Laguna-XS-2.1 geometry, lean
# layout (routed experts and attention q/k/v/o NVFP4), in one run: prefill, single-stream decode
# at depth, aggregate decode over concurrent streams. For a GPU machine without internet (e.g. one
# H200, CUDA 13 with nvcc, python3 with numpy + pyyaml); run from anywhere in the repository:
#
#   FP4FORGE_BIN=target/release/fp4forge LLAMA_SRC=/path/to/llama.cpp WORK=/mnt/x/bench \
#     benches/gpu_vs_llamacpp.sh          # table on stdout, WORK/report.md, WORK/results.json
#
# Steps:
#   1. llama.cpp: the source is LLAMA_SRC (a llama.cpp tree, e.g. the vendor/llama.cpp of the
#      llama-cpp-python 0.3.36 sdist, trimmed as /work/shared/tools/README.md says; tools/ and
#      gguf-py/ must be there), else vendor/llama.cpp unpacked from LLAMA_SDIST (the sdist
#      tarball), else that sdist fetched with `pip download --no-deps --no-binary
#      llama-cpp-python llama-cpp-python==0.3.36` (needs PyPI). Configured with
#        -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=<the GPU's, 90 on
#        an H200> -DGGML_NATIVE=ON -DGGML_CUDA_FA_QUANTS=f16-f16 -DLLAMA_CURL=OFF
#        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF
#        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_COMMIT=<LLAMA_COMMIT>
#      (the shared tools README's flags), Ninja when installed (else Makefiles), targets
#      `llama-bench llama-batched-bench`, -j$(nproc): ~5 minutes on 16 cores. Built once into
#      LLAMA_BUILD/build; reused while its build stamp (flags, nvcc version, a digest of the
#      source files) matches. `llama-bench --version` is printed and reported.
#   2. Per model in MODELS (files under WORK/models/MODEL, reused when complete; the stock
#      checkpoint is deleted once the lean one is written):
#        fp4forge synth --preset MODEL --stock-nvfp4 STOCK      seeded synthetic weights, the real
#                                                              checkpoint's tensors and bytes
#        fp4forge quantize STOCK LEAN                          the lean build (+ q/k/v/o NVFP4)
#        python3 TOOLS/word_tokenizer.py VOCAB LEAN            a WordLevel tokenizer (t0 … tN-1),
#                                                              so serve can serve it and bench can
#                                                              send exact token-id prompts
#        fp4forge inspect LEAN --json                          weight bytes read per token
#        GGUF_PY=LLAMA_SRC/gguf-py python3 TOOLS/make_laguna_gguf.py MODEL-lean.gguf
#          --model MODEL --layout lean                         the same geometry and layout for
#                                                              llama.cpp (arch `laguna`), random
#                                                              finite weights
#   3. llama.cpp, full offload and flash attention (ARGS = -m GGUF -ngl 99 -fa 1):
#        llama-bench ARGS -r REPS -o json -p PROMPTS -n 0                   prefill from empty
#        llama-bench ARGS -r REPS -o json -p MIN(PROMPTS) -n 0 -d PREFILL_DEPTH  prefill at depth
#        llama-bench ARGS -r REPS -o json -p 0 -n GEN -d 0,DECODE_DEPTHS     decode at depth
#        llama-batched-bench ARGS -c MAX(C)*(SWEEP_PROMPT+GEN) -npp SWEEP_PROMPT -ntg GEN
#          -npl CONCURRENCY --output-format jsonl          aggregate decode S_TG = B*GEN / T_TG
#      llama-bench and batched-bench draw their prompt and decode tokens at random.
#   4. fp4forge through the server (the production path):
#        fp4forge serve LEAN --device DEVICE --port 0 --served-model-name MODEL-lean
#          --max-batch MAX(32, C) --prefill-budget PREFILL_BUDGET --disable-log-requests
#      (waits for its "on http://…" line and /health; stopped by a trap at exit), then
#        fp4forge bench URL --model MODEL-lean --tokenizer LEAN --random-ids --repetitions REPS
#          --warmup 1 --context PROMPTS --max-tokens 1 --concurrency 0 --json ff-prefill.json
#        fp4forge bench URL … --context SWEEP_PROMPT,DECODE_DEPTHS --max-tokens GEN
#          --concurrency CONCURRENCY --sweep-context SWEEP_PROMPT --json ff-decode.json
#      --random-ids: exact-length prompts of token ids drawn at random from the vocabulary, as
#      llama.cpp's; prose through the stand-in tokenizer would be one unknown id repeated, which
#      sends every token of the MoE down the same experts. Prefill = prompt tokens / TTFT of one
#      request with 1 generated token; decode = 1 / TPOT; aggregate decode at C streams =
#      C / median TPOT of C streams each sending REPS requests back to back (the wall-clock
#      output tok/s, prefill included, is reported beside it).
#   5. A markdown table per model on stdout (also WORK/report.md; columns fp4forge, llama.cpp,
#      fp4forge / llama.cpp): prefill tok/s (+ TTFT) per prompt length, prefill at depth
#      (llama.cpp only: serve has no way to time a chunk after a cached prefix), single-stream
#      decode at a 128-token prompt and at each DECODE_DEPTHS, aggregate decode (+ TPOT) per
#      concurrency; the machine (GPU name, driver, CUDA, clocks, CPU), both commits; and
#      WORK/results.json (every raw number, both engines' outputs, the commands). Logs and raw
#      outputs: WORK/runs/MODEL/. A failed measurement is reported as such; the others still run.
#
# Environment (all optional):
#   FP4FORGE_BIN=target/release/fp4forge  the binary (build it with --features cuda; copied into
#                                    WORK/bin so a rebuild cannot swap it mid-run)
#   WORK=/tmp/fp4forge-gpu-bench     work dir; holds the models too: XS needs ~42 GB at its peak
#                                    (stock + lean), then ~41 GB (lean + GGUF); S ~3.4x that.
#                                    A tmpfs is best: mount -t tmpfs -o size=100g tmpfs /mnt/x
#   FP4FORGE_COMMIT=                 the binary's commit for the report (default: the commit
#                                    `fp4forge --version` names, recorded when it was built (not
#                                    whether its tree had changes); else the repository's git
#                                    HEAD, "+dirty crates/" when crates/ has changes)
#   TOOLS=<repo>/../shared/tools     make_laguna_gguf.py and word_tokenizer.py
#   LLAMA_SRC=                       llama.cpp source tree (see step 1)
#   LLAMA_SDIST=                     llama-cpp-python sdist tarball (see step 1)
#   LLAMA_CPP_PYTHON_VERSION=0.3.36  the sdist pip fetches when neither is given
#   LLAMA_COMMIT=                    llama.cpp commit for the report and the build info; default:
#                                    LLAMA_SRC's git HEAD if it is a git checkout, else 0c1e570
#                                    (the commit vendored in llama-cpp-python 0.3.36)
#   LLAMA_BUILD=/tmp/fp4forge-llamacpp-cuda  llama.cpp build cache (and the unpacked sdist)
#   LLAMA_CMAKE_EXTRA=               extra cmake flags (part of the build stamp)
#   CUDA_ARCH=                       CMAKE_CUDA_ARCHITECTURES (default: nvidia-smi's compute
#                                    capability, e.g. 90; 90 if nvidia-smi cannot tell)
#   LLAMA_BENCH_EXTRA=               extra llama-bench / llama-batched-bench flags (e.g. "-ub 2048")
#   MODELS=xs                        geometries, in order: xs, s ("xs s" adds Laguna-S where
#                                    memory and disk allow); tiny is for testing this script
#                                    (fp4forge only: make_laguna_gguf.py has no tiny geometry)
#   PROMPTS="2048 16384"             prefill prompt lengths
#   PREFILL_DEPTH=16384              llama.cpp's prefill of MIN(PROMPTS) tokens after this many
#                                    (0: not measured)
#   DECODE_DEPTHS="2048 16384"       single-stream decode contexts besides the 128-token prompt
#   SWEEP_PROMPT=128                 prompt of the single-stream decode and of the concurrency sweep
#   CONCURRENCY="1 4 16 32"          concurrent streams (fp4forge) = parallel sequences B (llama.cpp)
#   GEN=128                          tokens generated per request / sequence
#   REPS=3                           llama-bench repetitions; fp4forge bench requests per length and
#                                    per stream
#   PREFILL_BUDGET=2048              serve's --prefill-budget: prompt tokens per engine step
#                                    (llama.cpp prefills 2048-token batches by default; serve's own
#                                    default, 256, suits mixed traffic, not a prefill benchmark)
#   FF_SERVE_EXTRA=                  extra `fp4forge serve` flags (e.g. "--kv-cache-dtype fp8")
#   DEVICE=cuda                      serve's --device (cuda or cuda:N; cpu only to test this script
#                                    without a GPU, e.g. MODELS=tiny SKIP_LLAMA=1 DEVICE=cpu)
#   SERVE_TIMEOUT=900                seconds to wait for the server to load
#   SKIP_LLAMA=0  SKIP_FP4FORGE=0    1: leave that engine out
#   KEEP_STOCK=0                     1: keep the stock checkpoint after quantizing
#   CLEANUP=0                        1: delete each model's files once it is measured (for S on a
#                                    tmpfs that cannot hold two geometries)
#   SPACE_CHECK=1                    0: do not refuse to write a model into a too-small WORK
#   REPORT_ONLY=0                    1: only redo step 5 from what WORK holds
#   PYTHON=python3
set -euo pipefail

if [[ $# -gt 0 ]]; then
  case $1 in
    -h|--help) sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_vs_llamacpp.sh takes no arguments (settings are environment variables; see --help)" >&2; exit 2 ;;
  esac
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FP4FORGE_BIN="${FP4FORGE_BIN:-target/release/fp4forge}"
WORK="${WORK:-/tmp/fp4forge-gpu-bench}"
TOOLS="${TOOLS:-$ROOT/../shared/tools}"
LLAMA_SRC="${LLAMA_SRC:-}"
LLAMA_SDIST="${LLAMA_SDIST:-}"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
LLAMA_COMMIT="${LLAMA_COMMIT:-}"
FP4FORGE_COMMIT="${FP4FORGE_COMMIT:-}"
LLAMA_BUILD="${LLAMA_BUILD:-/tmp/fp4forge-llamacpp-cuda}"
LLAMA_CMAKE_EXTRA="${LLAMA_CMAKE_EXTRA:-}"
CUDA_ARCH="${CUDA_ARCH:-}"
LLAMA_BENCH_EXTRA="${LLAMA_BENCH_EXTRA:-}"
MODELS="${MODELS:-xs}"
PROMPTS="${PROMPTS:-2048 16384}"
PREFILL_DEPTH="${PREFILL_DEPTH:-16384}"
DECODE_DEPTHS="${DECODE_DEPTHS-2048 16384}"
SWEEP_PROMPT="${SWEEP_PROMPT:-128}"
CONCURRENCY="${CONCURRENCY:-1 4 16 32}"
GEN="${GEN:-128}"
REPS="${REPS:-3}"
PREFILL_BUDGET="${PREFILL_BUDGET:-2048}"
FF_SERVE_EXTRA="${FF_SERVE_EXTRA:-}"
DEVICE="${DEVICE:-cuda}"
SERVE_TIMEOUT="${SERVE_TIMEOUT:-900}"
SKIP_LLAMA="${SKIP_LLAMA:-0}"
SKIP_FP4FORGE="${SKIP_FP4FORGE:-0}"
KEEP_STOCK="${KEEP_STOCK:-0}"
CLEANUP="${CLEANUP:-0}"
SPACE_CHECK="${SPACE_CHECK:-1}"
REPORT_ONLY="${REPORT_ONLY:-0}"
PYTHON="${PYTHON:-python3}"

log() { printf '[gpu-bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# ---- arguments ---------------------------------------------------------------------------------
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }
for v in PROMPTS CONCURRENCY DECODE_DEPTHS; do
  for x in ${!v}; do is_count "$x" || die "$v: '$x' is not a positive whole number"; done
done
[[ -n ${PROMPTS// } ]] || die "PROMPTS is empty"
[[ -n ${CONCURRENCY// } ]] || die "CONCURRENCY is empty"
for v in GEN REPS SWEEP_PROMPT PREFILL_BUDGET SERVE_TIMEOUT; do
  is_count "${!v}" || die "$v=${!v}: expected a positive whole number"
done
[[ $PREFILL_DEPTH =~ ^[0-9]+$ ]] || die "PREFILL_DEPTH=$PREFILL_DEPTH: expected a whole number"
(( GEN >= 2 )) || die "GEN=$GEN: decode speed needs at least 2 generated tokens"
for v in SKIP_LLAMA SKIP_FP4FORGE KEEP_STOCK CLEANUP SPACE_CHECK REPORT_ONLY; do
  [[ ${!v} == 0 || ${!v} == 1 ]] || die "$v=${!v}: expected 0 or 1"
done
for m in $MODELS; do
  case $m in xs|s|tiny) ;; *) die "MODELS: unknown geometry '$m' (xs, s, tiny)" ;; esac
done
[[ -n ${MODELS// } ]] || die "MODELS is empty"
[[ $DEVICE =~ ^(cpu|cuda(:[0-9]+)?)$ ]] || die "DEVICE=$DEVICE: expected cuda, cuda:N or cpu"
if [[ $REPORT_ONLY == 0 && $SKIP_LLAMA == 1 && $SKIP_FP4FORGE == 1 ]]; then
  die "SKIP_LLAMA=1 and SKIP_FP4FORGE=1: nothing to measure"
fi
csv() { local IFS=,; echo "$*"; }   # csv WORDS...: comma-joined
max_of() { local m=0 x; for x in "$@"; do (( x > m )) && m=$x; done; echo "$m"; }
min_of() { local m=$1 x; for x in "$@"; do (( x < m )) && m=$x; done; echo "$m"; }
# shellcheck disable=SC2086
{
  PROMPTS_CSV=$(csv $PROMPTS)
  CONC_CSV=$(csv $CONCURRENCY)
  MAX_C=$(max_of $CONCURRENCY)
  MIN_PROMPT=$(min_of $PROMPTS)
  FF_DECODE_CSV=$(csv "$SWEEP_PROMPT" $DECODE_DEPTHS)
  LLAMA_DEPTHS_CSV=$(csv 0 $DECODE_DEPTHS)
}
command -v "$PYTHON" >/dev/null || die "$PYTHON missing"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"

# ---- measurement ---------------------------------------------------------------------------------
if [[ $REPORT_ONLY == 0 ]]; then
[[ -d $TOOLS ]] || die "TOOLS=$TOOLS: no such directory (make_laguna_gguf.py, word_tokenizer.py)"
TOOLS="$(cd "$TOOLS" && pwd)"
for f in make_laguna_gguf.py word_tokenizer.py; do [[ -f $TOOLS/$f ]] || die "$TOOLS/$f missing"; done
# nvcc (llama.cpp's build) and NVRTC + the driver (fp4forge's, found through the loader's path).
[[ -d /usr/local/cuda/bin ]] && PATH="$PATH:/usr/local/cuda/bin"
source "$ROOT/scripts/cuda-env.sh"
NEED_LLAMA=0
for m in $MODELS; do [[ $m == tiny ]] || NEED_LLAMA=1; done
if [[ $SKIP_LLAMA == 1 ]]; then NEED_LLAMA=0; fi
if [[ $SKIP_LLAMA == 0 && $NEED_LLAMA == 0 ]]; then log "MODELS=$MODELS: no llama.cpp geometry; llama.cpp left out"; fi
FF=""
if [[ $SKIP_FP4FORGE == 0 ]]; then
  [[ -x $FP4FORGE_BIN ]] || die "FP4FORGE_BIN=$FP4FORGE_BIN: not an executable (cargo build --release --features cuda -p fp4forge)"
  mkdir -p "$WORK/bin"
  cp "$FP4FORGE_BIN" "$WORK/bin/fp4forge.new" && mv "$WORK/bin/fp4forge.new" "$WORK/bin/fp4forge"
  FF="$WORK/bin/fp4forge"
  "$FF" bench --help | grep -q -- '--random-ids' || die "$FP4FORGE_BIN: its bench has no --random-ids (a binary older than this script)"
fi

# ---- 1. llama.cpp ------------------------------------------------------------------------------------
LLAMA_BENCH="" LLAMA_BATCHED="" LLAMA_VERSION="" LLAMA_DIGEST="" LLAMA_ORIGIN=""
if [[ $NEED_LLAMA == 1 ]]; then
  if [[ -n $LLAMA_SRC ]]; then
    [[ -d $LLAMA_SRC ]] || die "LLAMA_SRC=$LLAMA_SRC: no such directory"
    LLAMA_SRC="$(cd "$LLAMA_SRC" && pwd)"
    LLAMA_ORIGIN="LLAMA_SRC=$LLAMA_SRC"
  else
    if [[ -z $LLAMA_SDIST ]]; then
      LLAMA_SDIST="$LLAMA_BUILD/dl/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
      if [[ ! -f $LLAMA_SDIST ]]; then
        # The sdist only. --no-binary for llama-cpp-python alone: with :all: pip would build the
        # build backend's whole dependency tree from source to read the metadata (many minutes).
        log "no LLAMA_SRC or LLAMA_SDIST: pip download llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (sdist, ~77 MB)"
        mkdir -p "$LLAMA_BUILD/dl"
        "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-python --disable-pip-version-check \
          -d "$LLAMA_BUILD/dl" "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2 \
          || die "cannot fetch the sdist (no internet?): set LLAMA_SRC to a llama.cpp tree or LLAMA_SDIST to the tarball"
      fi
    fi
    [[ -f $LLAMA_SDIST ]] || die "LLAMA_SDIST=$LLAMA_SDIST: no such file"
    LLAMA_SDIST="$(cd "$(dirname "$LLAMA_SDIST")" && pwd)/$(basename "$LLAMA_SDIST")"
    LLAMA_ORIGIN="vendor/llama.cpp of $(basename "$LLAMA_SDIST")"
    SDIST_ID="$(basename "$LLAMA_SDIST") $(stat -c %s "$LLAMA_SDIST")"
    # The llama.cpp tree inside the tarball: the shallowest directory with CMakeLists.txt and
    # tools/llama-bench/llama-bench.cpp.
    UNPACKED="$LLAMA_BUILD/src"
    if [[ ! -f $UNPACKED/.sdist || "$(cat "$UNPACKED/.sdist")" != "$SDIST_ID" ]]; then
      log "unpacking llama.cpp from $LLAMA_SDIST"
      rm -rf "$UNPACKED" && mkdir -p "$UNPACKED"
      "$PYTHON" - "$LLAMA_SDIST" "$UNPACKED" <<'EOF' || die "no llama.cpp tree in $LLAMA_SDIST"
import os, sys, tarfile
sdist, out = sys.argv[1:]
with tarfile.open(sdist) as tar:
    names = set(tar.getnames())
    roots = sorted((os.path.dirname(n) for n in names if n.endswith("/CMakeLists.txt") or n == "CMakeLists.txt"
                    if os.path.join(os.path.dirname(n), "tools/llama-bench/llama-bench.cpp") in names),
                   key=lambda d: d.count("/"))
    if not roots:
        sys.exit("no directory with CMakeLists.txt and tools/llama-bench/llama-bench.cpp")
    root = roots[0]
    members = [m for m in tar.getmembers() if m.name == root or m.name.startswith(root + "/")]
    for m in members:   # plain files and directories only, no links out of the tree
        if not (m.isfile() or m.isdir()) or m.name.startswith("/") or ".." in m.name.split("/"):
            continue
        if hasattr(tarfile, "data_filter"):
            tar.extract(m, out, filter="data")
        else:
            tar.extract(m, out)
    open(os.path.join(out, ".root"), "w").write(root)
EOF
      printf '%s' "$SDIST_ID" > "$UNPACKED/.sdist"
    fi
    LLAMA_SRC="$UNPACKED/$(cat "$UNPACKED/.root")"
  fi
  [[ -f $LLAMA_SRC/CMakeLists.txt && -f $LLAMA_SRC/tools/llama-bench/llama-bench.cpp \
     && -f $LLAMA_SRC/tools/batched-bench/batched-bench.cpp ]] \
    || die "$LLAMA_SRC: not a llama.cpp tree with tools/llama-bench and tools/batched-bench"
  [[ -d $LLAMA_SRC/gguf-py/gguf ]] || die "$LLAMA_SRC/gguf-py missing (make_laguna_gguf.py needs it)"
  if [[ -z $LLAMA_COMMIT ]]; then
    if [[ "$(git -C "$LLAMA_SRC" rev-parse --show-toplevel 2>/dev/null)" == "$LLAMA_SRC" ]]; then
      LLAMA_COMMIT="$(git -C "$LLAMA_SRC" rev-parse --short HEAD)"
    else
      LLAMA_COMMIT=0c1e570
    fi
  fi
  # A digest of what is compiled, so the report names the source even without git.
  LLAMA_DIGEST="$("$PYTHON" - "$LLAMA_SRC" <<'EOF'
import hashlib, os, sys
root, h = sys.argv[1], hashlib.sha256()
dirs = ["src", "include", "common", "ggml/include", "ggml/src/ggml-cuda", "ggml/src/ggml-cpu",
        "tools/llama-bench", "tools/batched-bench"]
files = [f for f in os.listdir(os.path.join(root, "ggml/src")) if os.path.isfile(os.path.join(root, "ggml/src", f))]
paths = [os.path.join("ggml/src", f) for f in files]
for d in dirs:
    for dp, _, fs in os.walk(os.path.join(root, d)):
        paths += [os.path.relpath(os.path.join(dp, f), root) for f in fs]
for p in sorted(paths):
    h.update(p.encode() + b"\0" + open(os.path.join(root, p), "rb").read())
print(h.hexdigest()[:16])
EOF
)"
  if [[ -z $CUDA_ARCH ]]; then
    cap="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | sed -n 1p | tr -d ' .')" || cap=""
    CUDA_ARCH="${cap:-90}"
  fi
  command -v cmake >/dev/null || die "cmake missing (apt-get install cmake, or pip install cmake)"
  command -v nvcc >/dev/null || die "nvcc missing (CUDA toolkit; /usr/local/cuda/bin is searched)"
  if command -v ninja >/dev/null; then GENERATOR=Ninja; else GENERATOR="Unix Makefiles"; fi
  # shellcheck disable=SC2206
  LLAMA_FLAGS=(-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCH"
    -DGGML_NATIVE=ON -DGGML_CUDA_FA_QUANTS=f16-f16 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
    "-DLLAMA_BUILD_COMMIT=$LLAMA_COMMIT" $LLAMA_CMAKE_EXTRA)
  NVCC_VERSION="$(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | sed -n 1p)"
  BUILD="$LLAMA_BUILD/build"
  STAMP="$BUILD/fp4forge-build-stamp"
  WANT_STAMP="src $LLAMA_DIGEST nvcc $NVCC_VERSION $GENERATOR ${LLAMA_FLAGS[*]}"
  LLAMA_BENCH="$BUILD/bin/llama-bench"
  LLAMA_BATCHED="$BUILD/bin/llama-batched-bench"
  if [[ -x $LLAMA_BENCH && -x $LLAMA_BATCHED && -f $STAMP && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
    log "llama.cpp cached: $BUILD"
  else
    log "building llama.cpp ($LLAMA_ORIGIN, CUDA arch $CUDA_ARCH, $GENERATOR, -j$(nproc)): ~5 min"
    rm -rf "$BUILD" && mkdir -p "$BUILD"
    cmake -S "$LLAMA_SRC" -B "$BUILD" -G "$GENERATOR" "${LLAMA_FLAGS[@]}" > "$LLAMA_BUILD/cmake.log" 2>&1 \
      || { tail -30 "$LLAMA_BUILD/cmake.log" >&2; die "cmake failed (see $LLAMA_BUILD/cmake.log)"; }
    cmake --build "$BUILD" -j "$(nproc)" --target llama-bench llama-batched-bench > "$LLAMA_BUILD/build.log" 2>&1 \
      || { tail -30 "$LLAMA_BUILD/build.log" >&2; die "build failed (see $LLAMA_BUILD/build.log)"; }
    [[ -x $LLAMA_BENCH && -x $LLAMA_BATCHED ]] || die "llama-bench / llama-batched-bench not built in $BUILD/bin"
    printf '%s' "$WANT_STAMP" > "$STAMP"
  fi
  LLAMA_VERSION="$("$LLAMA_BENCH" --version 2>&1 | tr '\n' ' ' | sed 's/ *$//')" || true
  log "llama.cpp: $LLAMA_VERSION (commit $LLAMA_COMMIT, source digest $LLAMA_DIGEST, $LLAMA_ORIGIN)"
fi

# ---- machine ------------------------------------------------------------------------------------------
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  if command -v nvidia-smi >/dev/null; then
    q=name,driver_version,memory.total,compute_cap,clocks.max.sm,clocks.max.mem,clocks.sm,clocks.mem,power.limit,persistence_mode
    nvidia-smi --query-gpu="$q" --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' || echo "gpu: nvidia-smi failed"
    echo "gpu fields: $q"
    echo "cuda driver: $(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | sed -n 1p)"
  else
    echo "gpu: none (no nvidia-smi)"
  fi
  echo "nvcc: $(command -v nvcc >/dev/null && nvcc --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 (\2)/p' | sed -n 1p || echo none)"
  echo "cpu: $(lscpu | sed -n 's/^Model name: *//p' | sed -n 1p), $(nproc) cores (nproc)"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2 " GiB"}')"
  echo "kernel: $(uname -sr)"
  echo "work dir: $WORK ($(df -T "$WORK" | awk 'NR == 2 {print $2 ", " int($5 / 1048576) " GiB free"}'))"
  if [[ -n $FF ]]; then
    if [[ -z $FP4FORGE_COMMIT ]]; then
      # the commit the binary was built from (`fp4forge --version`: "fp4forge V (git C)"), else
      # this checkout's HEAD (a GPU machine's copy of the repository may not have the history)
      FP4FORGE_COMMIT="$("$FF" --version 2>/dev/null | sed -n 's/.*(git \([^)]*\)).*/\1/p')"
      [[ $FP4FORGE_COMMIT != unknown ]] || FP4FORGE_COMMIT=
      if [[ -z $FP4FORGE_COMMIT ]] && FP4FORGE_COMMIT="$(git rev-parse --short HEAD 2>/dev/null)"; then
        git diff --quiet HEAD -- crates 2>/dev/null || FP4FORGE_COMMIT+="+dirty crates/"
      fi
    fi
    echo "fp4forge: commit ${FP4FORGE_COMMIT:-unknown (no git; set FP4FORGE_COMMIT)}, $("$FF" --version), binary $FP4FORGE_BIN"
  fi
  if [[ $NEED_LLAMA == 1 ]]; then
    echo "llama.cpp: commit $LLAMA_COMMIT, source digest $LLAMA_DIGEST ($LLAMA_ORIGIN); $LLAMA_VERSION"
    echo "llama.cpp build: ${LLAMA_FLAGS[*]}, nvcc $NVCC_VERSION, $GENERATOR"
  fi
} > "$WORK/machine.txt"
cat "$WORK/machine.txt" >&2
# What the report needs to read this run back (REPORT_ONLY=1).
{
  for v in MODELS PROMPTS PREFILL_DEPTH DECODE_DEPTHS SWEEP_PROMPT CONCURRENCY GEN REPS PREFILL_BUDGET DEVICE SKIP_LLAMA SKIP_FP4FORGE; do
    printf '%s=%q\n' "$v" "${!v}"
  done
} > "$WORK/params.env"
: > "$WORK/commands.tsv"

# ---- 2-4. per model ---------------------------------------------------------------------------------
SERVE_PID=""
stop_serve() {
  [[ -n $SERVE_PID ]] || return 0
  if kill -0 "$SERVE_PID" 2>/dev/null; then
    kill -TERM "$SERVE_PID" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$SERVE_PID" 2>/dev/null && { log "server $SERVE_PID did not stop in 30 s: SIGKILL"; kill -KILL "$SERVE_PID" 2>/dev/null || true; }
  fi
  wait "$SERVE_PID" 2>/dev/null || true
  SERVE_PID=""
}
# Measurements run in the background and are waited for, so that a signal reaches the trap at once
# (bash runs traps only between foreground commands); the trap stops what is running.
CHILD=""
cleanup() {
  if [[ -n $CHILD ]] && kill -0 "$CHILD" 2>/dev/null; then kill -TERM "$CHILD" 2>/dev/null || true; fi
  stop_serve
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# record MODEL KEY CMD...: the command as run, for the report.
record() {
  local m=$1 k=$2 a q=""; shift 2
  for a in "$@"; do   # shell-quoted where needed (printf %q would also escape the commas)
    if [[ $a =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then q+=" $a"; else q+=" $(printf '%q' "$a")"; fi
  done
  printf '%s\t%s\t%s\n' "$m" "$k" "${q# }" >> "$WORK/commands.tsv"
}
# measure MODEL KEY OUT ERR CMD...: runs CMD (stdout to OUT, stderr to ERR); a failure is logged and
# recorded (the report marks it), not fatal.
measure() {
  local m=$1 k=$2 out=$3 err=$4 rc=0; shift 4
  record "$m" "$k" "$@"
  log "  $k: $*"
  "$@" > "$out" 2> "$err" &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=""
  if [[ $rc != 0 ]]; then
    tail -15 "$err" >&2
    log "  $k FAILED (exit $rc; $err)"
    printf '%s\t%s\n' "$k" "$rc" >> "$(dirname "$out")/failed.tsv"
  fi
  return 0
}
free_bytes() { df -B1 --output=avail "$1" | awk 'NR == 2 {print $1}'; }
# need_space WHAT GB: refuses (SPACE_CHECK=1) to start a write of GB gigabytes that cannot fit.
need_space() {
  [[ $SPACE_CHECK == 1 ]] || return 0
  local have; have=$(free_bytes "$WORK")
  (( have >= $2 * 1000000000 )) || die "$1 needs ~$2 GB; $WORK has $((have / 1000000000)) GB free (a bigger tmpfs, CLEANUP=1, or SPACE_CHECK=0)"
}
# Approximate sizes in GB: stock checkpoint, lean checkpoint, lean GGUF.
model_sizes() { case $1 in xs) echo "23 21 21" ;; s) echo "76 71 70" ;; *) echo "1 1 1" ;; esac; }

for m in $MODELS; do
  D="$WORK/models/$m"
  R="$WORK/runs/$m"
  STOCK="$D/stock" LEAN="$D/lean" GGUF="$D/$m-lean.gguf" NAME="$m-lean"
  rm -rf "$R" && mkdir -p "$R" "$D"
  read -r SZ_STOCK SZ_LEAN SZ_GGUF <<< "$(model_sizes "$m")"
  LLAMA_HERE=$NEED_LLAMA
  [[ $m == tiny ]] && LLAMA_HERE=0
  log "== $m"

  # -- files: lean safetensors (+ tokenizer), then the GGUF
  if [[ $SKIP_FP4FORGE == 1 ]]; then
    :
  elif [[ -f $D/lean.ok && -d $LEAN ]]; then
    log "reusing $LEAN"
  else
    rm -rf "$LEAN"
    if [[ ! -f $D/stock.ok || ! -d $STOCK ]]; then
      rm -rf "$STOCK" "$D/stock.ok"
      need_space "the $m stock checkpoint + its lean build" $((SZ_STOCK + SZ_LEAN))
      log "fp4forge synth --preset $m --stock-nvfp4 $STOCK"
      "$FF" synth --preset "$m" --stock-nvfp4 "$STOCK" >&2
      touch "$D/stock.ok"
    fi
    need_space "the $m lean checkpoint" "$SZ_LEAN"
    log "fp4forge quantize $STOCK $LEAN"
    "$FF" quantize "$STOCK" "$LEAN" >&2
    VOCAB="$("$PYTHON" -c 'import json, sys
c = json.load(open(sys.argv[1]))
print(c.get("vocab_size") or c["text_config"]["vocab_size"])' "$LEAN/config.json")"
    "$PYTHON" "$TOOLS/word_tokenizer.py" "$VOCAB" "$LEAN"
    touch "$D/lean.ok"
    if [[ $KEEP_STOCK == 0 ]]; then rm -rf "$STOCK" "$D/stock.ok"; fi
  fi
  if [[ $SKIP_FP4FORGE == 0 ]]; then
    "$FF" inspect "$LEAN" --json > "$D/lean-inspect.json" || log "fp4forge inspect failed (bytes per token left out)"
  fi
  if [[ $LLAMA_HERE == 1 ]]; then
    if [[ -f $D/gguf.ok && -f $GGUF ]]; then
      log "reusing $GGUF"
    else
      rm -f "$GGUF" "$D/gguf.ok"
      need_space "the $m lean GGUF" "$SZ_GGUF"
      log "make_laguna_gguf.py $GGUF --model $m --layout lean (~2 GB/s)"
      GGUF_PY="$LLAMA_SRC/gguf-py" "$PYTHON" "$TOOLS/make_laguna_gguf.py" "$GGUF" --model "$m" --layout lean \
        --threads "$(min_of "$(nproc)" 16)" > "$D/gguf-summary.json" || die "make_laguna_gguf.py failed"
      touch "$D/gguf.ok"
    fi
  fi

  # -- llama.cpp
  if [[ $LLAMA_HERE == 1 ]]; then
    log "llama.cpp on $GGUF"
    # shellcheck disable=SC2206
    LARGS=(-m "$GGUF" -ngl 99 -fa 1 $LLAMA_BENCH_EXTRA)
    LB=("$LLAMA_BENCH" "${LARGS[@]}" -r "$REPS" -o json)
    measure "$m" llama-pp "$R/llama-pp.json" "$R/llama-pp.log" "${LB[@]}" -p "$PROMPTS_CSV" -n 0
    if (( PREFILL_DEPTH > 0 )); then
      measure "$m" llama-ppd "$R/llama-ppd.json" "$R/llama-ppd.log" "${LB[@]}" -p "$MIN_PROMPT" -n 0 -d "$PREFILL_DEPTH"
    fi
    measure "$m" llama-tg "$R/llama-tg.json" "$R/llama-tg.log" "${LB[@]}" -p 0 -n "$GEN" -d "$LLAMA_DEPTHS_CSV"
    measure "$m" llama-batched "$R/llama-batched.out" "$R/llama-batched.log" "$LLAMA_BATCHED" "${LARGS[@]}" \
      -c $((MAX_C * (SWEEP_PROMPT + GEN))) -npp "$SWEEP_PROMPT" -ntg "$GEN" -npl "$CONC_CSV" --output-format jsonl
  fi

  # -- fp4forge serve + bench
  if [[ $SKIP_FP4FORGE == 0 ]]; then
    # shellcheck disable=SC2206
    # An API key in the environment would make the server demand it; the bench sends none.
    SERVE=(env -u FP4FORGE_API_KEY -u VLLM_API_KEY "$FF" serve "$LEAN" --device "$DEVICE" --host 127.0.0.1 --port 0 --served-model-name "$NAME"
      --max-batch "$(max_of 32 "$MAX_C")" --prefill-budget "$PREFILL_BUDGET" --disable-log-requests $FF_SERVE_EXTRA)
    record "$m" ff-serve "${SERVE[@]}"
    log "fp4forge: ${SERVE[*]}"
    "${SERVE[@]}" > "$R/serve.log" 2>&1 &
    SERVE_PID=$!
    URL="" waited=0
    while [[ -z $URL ]]; do
      kill -0 "$SERVE_PID" 2>/dev/null || { tail -20 "$R/serve.log" >&2; SERVE_PID=""; die "fp4forge serve exited (see $R/serve.log)"; }
      URL="$(sed -n 's|.* on \(http://[^ ]*\)/v1 .*|\1|p' "$R/serve.log" | sed -n 1p)"
      if [[ -z $URL ]]; then
        (( waited < SERVE_TIMEOUT )) || die "fp4forge serve not up after ${SERVE_TIMEOUT}s (see $R/serve.log)"
        sleep 1; waited=$((waited + 1))
      fi
    done
    "$PYTHON" - "$URL/health" <<'EOF' || die "fp4forge serve: $URL/health did not answer ok"
import sys, time, urllib.request
for _ in range(60):
    try:
        with urllib.request.urlopen(sys.argv[1], timeout=5) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(1)
sys.exit(1)
EOF
    log "fp4forge serve up at $URL after ~${waited}s ($(sed -n 's/.*(context \([0-9]*\) tokens, backend \([^)]*\)).*/context \1, backend \2/p' "$R/serve.log" | sed -n 1p))"
    FB=("$FF" bench "$URL" --model "$NAME" --tokenizer "$LEAN" --random-ids --repetitions "$REPS" --warmup 1)
    measure "$m" ff-prefill "$R/ff-prefill.txt" "$R/ff-prefill.log" "${FB[@]}" \
      --context "$PROMPTS_CSV" --max-tokens 1 --concurrency 0 --json "$R/ff-prefill.json"
    measure "$m" ff-decode "$R/ff-decode.txt" "$R/ff-decode.log" "${FB[@]}" \
      --context "$FF_DECODE_CSV" --max-tokens "$GEN" --concurrency "$CONC_CSV" --sweep-context "$SWEEP_PROMPT" \
      --json "$R/ff-decode.json" --svg "$R/ff-decode.svg"
    # The server's own account of its steps (fp4forge_engine_step_seconds against
    # fp4forge_forward_seconds: the host's share of a step) and its KV memory.
    "$PYTHON" -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' \
      "$URL/metrics" > "$R/ff-metrics.txt" || log "fp4forge serve: $URL/metrics did not answer"
    stop_serve
  fi
  if [[ $CLEANUP == 1 ]]; then
    log "CLEANUP=1: removing $D"
    rm -rf "$D"
  fi
done
fi   # REPORT_ONLY

# ---- 5. report ------------------------------------------------------------------------------------------
[[ -f $WORK/params.env && -f $WORK/machine.txt ]] || die "nothing measured in $WORK"
if [[ $REPORT_ONLY == 1 ]]; then
  # shellcheck disable=SC1091
  source "$WORK/params.env"
fi
export MODELS PROMPTS PREFILL_DEPTH DECODE_DEPTHS SWEEP_PROMPT CONCURRENCY GEN REPS PREFILL_BUDGET DEVICE
exec > >(tee "$WORK/report.md")
"$PYTHON" - "$WORK" <<'EOF'
import json, os, sys

work = sys.argv[1]
env = os.environ
models = env["MODELS"].split()
prompts = [int(x) for x in env["PROMPTS"].split()]
prefill_depth = int(env["PREFILL_DEPTH"])
depths = [int(x) for x in env["DECODE_DEPTHS"].split()]
sweep_prompt, gen, reps = int(env["SWEEP_PROMPT"]), int(env["GEN"]), int(env["REPS"])
concurrency = [int(x) for x in env["CONCURRENCY"].split()]

machine = {}
for line in open(os.path.join(work, "machine.txt")):
    k, _, v = line.rstrip("\n").partition(": ")
    machine[k] = v if k not in machine else machine[k] + "; " + v
commands = {}
if os.path.exists(os.path.join(work, "commands.tsv")):
    for line in open(os.path.join(work, "commands.tsv")):
        m, k, cmd = line.rstrip("\n").split("\t", 2)
        commands.setdefault(m, {})[k] = cmd


def json_values(text):
    """Every top-level JSON array or object in text (llama-bench's -o json / jsonl, with or
    without other output around it)."""
    dec, i, out = json.JSONDecoder(), 0, []
    while True:
        starts = [j for j in (text.find("[", i), text.find("{", i)) if j >= 0]
        if not starts:
            return out
        j = min(starts)
        try:
            v, end = dec.raw_decode(text, j)
            out.append(v)
            i = end
        except ValueError:
            i = j + 1


def llama_bench_tests(path):
    """The test records of a llama-bench JSON (or JSONL) output, [] when missing."""
    if not os.path.exists(path):
        return []
    tests = []
    for v in json_values(open(path, errors="replace").read()):
        for t in v if isinstance(v, list) else [v]:
            if isinstance(t, dict) and "avg_ts" in t and "n_prompt" in t:
                tests.append(t)
    return tests


BATCHED_COLS = ["pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"]


def batched_rows(path):
    """llama-batched-bench's results: its --output-format jsonl lines, or the rows of its markdown
    table (|PP|TG|B|N_KV|T_PP s|S_PP t/s|T_TG s|S_TG t/s|T s|S t/s|)."""
    if not os.path.exists(path):
        return []
    rows = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{") and "speed_tg" in line:
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
        elif line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 10:
                try:
                    vals = [float(c) for c in cells]
                except ValueError:
                    continue
                r = dict(zip(BATCHED_COLS, vals))
                for k in ("pp", "tg", "pl", "n_kv"):
                    r[k] = int(r[k])
                rows.append(r)
    return rows


def load_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


def num(x, nd=1):
    return "—" if x is None else f"{x:,.{nd}f}"


def ok(x):
    return x is not None and x == x and x not in (float("inf"), float("-inf"))


def ff_context(rep, n):
    for c in (rep or {}).get("contexts", []):
        if c["context"] == n:
            return c
    return None


report = {"machine": machine, "params": {k: env[k] for k in ("MODELS", "PROMPTS", "PREFILL_DEPTH",
          "DECODE_DEPTHS", "SWEEP_PROMPT", "CONCURRENCY", "GEN", "REPS", "PREFILL_BUDGET", "DEVICE")},
          "models": {}}
print("\n## fp4forge serve vs llama.cpp, synthetic Laguna lean geometry, one GPU\n")
for k, v in machine.items():
    print(f"    {k}: {v}")

for m in models:
    run = os.path.join(work, "runs", m)
    mdir = os.path.join(work, "models", m)
    failed = {}
    if os.path.exists(os.path.join(run, "failed.tsv")):
        failed = dict(l.rstrip("\n").split("\t") for l in open(os.path.join(run, "failed.tsv")))
    ff_pre = load_json(os.path.join(run, "ff-prefill.json"))
    ff_dec = load_json(os.path.join(run, "ff-decode.json"))
    pp = llama_bench_tests(os.path.join(run, "llama-pp.json"))
    ppd = llama_bench_tests(os.path.join(run, "llama-ppd.json"))
    tg = llama_bench_tests(os.path.join(run, "llama-tg.json"))
    bb = batched_rows(os.path.join(run, "llama-batched.out")) or batched_rows(os.path.join(run, "llama-batched.log"))
    inspect = load_json(os.path.join(mdir, "lean-inspect.json"))
    gguf = load_json(os.path.join(mdir, "gguf-summary.json"))

    def lt(tests, p, n, d):
        return next((t for t in tests if t["n_prompt"] == p and t["n_gen"] == n and t.get("n_depth", 0) == d), None)

    rows = []

    def row(metric, ff, ll, ff_cell=None, ll_cell=None, ff_extra=None, ll_extra=None):
        ratio = ff / ll if ok(ff) and ok(ll) and ll > 0 else None
        rows.append({"metric": metric, "fp4forge": ff if ok(ff) else None, "llama.cpp": ll if ok(ll) else None,
                     "ratio": ratio, "fp4forge_detail": ff_extra, "llama.cpp_detail": ll_extra,
                     "cells": [ff_cell if ff_cell is not None else num(ff if ok(ff) else None),
                               ll_cell if ll_cell is not None else num(ll if ok(ll) else None)]})

    for n in prompts:
        c = ff_context(ff_pre, n)
        ff = c["prefill_tok_s"] if c and not c.get("error") else None
        ff_ttft = c["ttft_ms"]["p50"] if c and ok(ff) else None
        t = lt(pp, n, 0, 0)
        ll = t["avg_ts"] if t else None
        ll_ttft = n / ll * 1e3 if ok(ll) and ll > 0 else None
        row(f"prefill {n} tokens, tok/s (TTFT ms)", ff, ll,
            f"{num(ff, 0)} ({num(ff_ttft, 0)} ms)" if ok(ff) else "—",
            f"{num(ll, 0)} ({num(ll_ttft, 0)} ms)" if ok(ll) else "—",
            {"ttft_ms_p50": ff_ttft, "prompt_tokens": c and c["prompt_tokens"], "error": c and c.get("error")},
            {"ttft_ms": ll_ttft, "stddev_ts": t and t["stddev_ts"], "samples_ts": t and t["samples_ts"]})
    if prefill_depth > 0 and (ppd or "llama-ppd" in commands.get(m, {})):
        p = min(prompts)
        t = lt(ppd, p, 0, prefill_depth)
        ll = t["avg_ts"] if t else None
        row(f"prefill {p} tokens after {prefill_depth} (llama.cpp only), tok/s", None, ll, "not measured", num(ll, 0),
            None, {"stddev_ts": t and t["stddev_ts"], "samples_ts": t and t["samples_ts"]})
    for d in [0] + depths:
        n_ff = sweep_prompt if d == 0 else d
        c = ff_context(ff_dec, n_ff)
        ff = c["decode_tok_s"] if c and not c.get("error") else None
        t = lt(tg, 0, gen, d)
        ll = t["avg_ts"] if t else None
        label = (f"decode, {sweep_prompt}-token prompt (llama.cpp: empty context), tok/s" if d == 0
                 else f"decode at {d} context, tok/s")
        row(label, ff, ll, None, None,
            {"tpot_ms_p50": c and c["tpot_ms"]["p50"], "min": c and c["decode_tok_s_min"],
             "max": c and c["decode_tok_s_max"], "completion_tokens": c and c["completion_tokens"],
             "error": c and c.get("error")},
            {"stddev_ts": t and t["stddev_ts"], "samples_ts": t and t["samples_ts"]})
    for C in concurrency:
        p = next((p for p in (ff_dec or {}).get("sweep", []) if p["concurrency"] == C), None)
        tpot = p["tpot_ms"]["p50"] if p and p["requests"] > 0 else None
        ff = C * 1e3 / tpot if ok(tpot) and tpot > 0 else None
        b = next((r for r in bb if r["pl"] == C and r["pp"] == sweep_prompt and r["tg"] == gen), None)
        ll = b["speed_tg"] if b else None
        ll_tpot = b["t_tg"] / gen * 1e3 if b else None
        row(f"aggregate decode, {C} stream{'s' if C > 1 else ''}, tok/s (TPOT ms)", ff, ll,
            f"{num(ff, 0)} ({num(tpot, 2)} ms)" if ok(ff) else "—",
            f"{num(ll, 0)} ({num(ll_tpot, 2)} ms)" if ok(ll) else "—",
            {"tpot_ms_p50": tpot, "output_tok_s_wall": p and p["output_tok_s"], "requests": p and p["requests"],
             "failed": p and p["failed"], "error": p and p.get("error")},
            {"t_tg_s": b and b["t_tg"], "tpot_ms": ll_tpot, "speed_pp": b and b["speed_pp"]})

    print(f"\n### {m} lean\n")
    bpt = (inspect or {}).get("totals", {}).get("bytes_per_token")
    gbpt = (gguf or {}).get("decode_weight_bytes_per_token")
    facts = []
    if bpt:
        facts.append(f"fp4forge {bpt / 1e9:.3f} GB (`inspect`)")
    if gbpt:
        facts.append(f"llama.cpp {gbpt / 1e9:.3f} GB (make_laguna_gguf.py; GGUF file "
                     f"{num(gguf.get('file_bytes') and gguf['file_bytes'] / 1e9, 2)} GB)")
    if facts:
        print(f"Weights read per decoded token: {'; '.join(facts)}.\n")
    print("| measurement | fp4forge serve | llama.cpp | fp4forge / llama.cpp |")
    print("|---|---:|---:|---:|")
    for r in rows:
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}x"
        print(f"| {r['metric']} | {r['cells'][0]} | {r['cells'][1]} | {ratio} |")
    errors = [f"{r['metric']}: {r['fp4forge_detail']['error']}" for r in rows
              if (r["fp4forge_detail"] or {}).get("error")]
    if errors:
        print("\nfp4forge bench errors: " + "; ".join(errors))
    missing = [C for C in concurrency if bb and not any(r["pl"] == C for r in bb)]
    if missing:
        print(f"\nllama-batched-bench left out B = {missing} (it skips a B whose contexts exceed its -c).")
    if failed:
        print(f"\nFailed (exit status): {', '.join(f'{k} ({v})' for k, v in failed.items())}; logs in {run}/.")
    walls = [f"{p['concurrency']}: {num(p['output_tok_s'], 0)}" for p in (ff_dec or {}).get("sweep", [])]
    if walls:
        print(f"\nfp4forge output tok/s over each sweep level's wall time (prefill and ramp included): {'; '.join(walls)}.")
    gi = next((t.get("gpu_info") for t in pp + tg if t.get("gpu_info")), None)
    bc = next((f"{t.get('build_commit')} ({t.get('build_number')})" for t in pp + tg if t.get("build_commit")), None)
    if gi or bc:
        print(f"\nllama-bench reports: gpu_info {gi}, build_commit {bc}.")
    report["models"][m] = {
        "rows": [{k: v for k, v in r.items() if k != "cells"} for r in rows],
        "failed": failed,
        "fp4forge": {"prefill": ff_pre, "decode": ff_dec, "bytes_per_token": bpt,
                     "serve_log": os.path.join(run, "serve.log")},
        "llama.cpp": {"pp": pp, "ppd": ppd, "tg": tg, "batched": bb, "gguf": gguf},
        "commands": commands.get(m, {}),
    }
    print()
    print("Commands:")
    for k, cmd in commands.get(m, {}).items():
        print(f"- {k}: `{cmd}`")

print("""
Notes: fp4forge is timed by its HTTP client (`fp4forge bench`: streamed /v1/completions, TTFT and
TPOT from chunk arrivals, so HTTP, SSE, sampling and detokenizing are inside its figures); llama.cpp
in-process. Prefill: one request of exactly N random token ids, 1 token generated (fp4forge: N / TTFT,
median of the requests; llama-bench: N / time of the prompt's decode, mean of its repetitions).
Single-stream decode: fp4forge 1 / TPOT after a prompt of that length, llama-bench tg after a
random context of that depth. Aggregate decode: fp4forge C / (median TPOT) with C streams each
sending requests back to back (continuous batching: other streams' prefills interleave), llama.cpp
S_TG = B x tokens / T_TG of B sequences decoded in lockstep (their prefill excluded). Both
engines' weights are synthetic (values do not change the work) in the same lean layout; KV cache:
fp4forge bf16, llama.cpp f16 (the defaults).""")
json.dump(report, open(os.path.join(work, "results.json"), "w"), indent=1)
print(f"\nJSON: {os.path.join(work, 'results.json')}   logs and raw outputs: {os.path.join(work, 'runs')}/")
EOF
