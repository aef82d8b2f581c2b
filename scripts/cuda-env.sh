# Sourced by the GPU scripts on the GPU machine: puts the directories holding the CUDA driver and
# NVRTC (libnvrtc.so.13) on the loader's path (the binaries load both at run time).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, "cu13", "lib") for p in nvidia.__path__))' 2>/dev/null || true); do
    if [ -d "$d" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; fi
done
search=${LD_LIBRARY_PATH:-}
if ! ls ${search//:/ } 2>/dev/null | grep -q libnvrtc; then
    lib=$(find / -name 'libnvrtc.so*' -not -path '*/proc/*' 2>/dev/null | head -1 || true)
    if [ -n "$lib" ]; then export LD_LIBRARY_PATH="$(dirname "$lib"):${LD_LIBRARY_PATH:-}"; fi
fi
