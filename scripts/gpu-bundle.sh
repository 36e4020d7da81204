#!/usr/bin/env bash
# Packs what the GPU checks need into one self-contained archive, for a GPU machine that
# has the NVIDIA driver and CUDA 13 (cuBLAS) but none of the project's build dependencies:
# the CUDA test programs, kvgen, kvmodel and kvbench (stripped), every shared library they
# load except glibc's and CUDA's own, the configs and scripts/gpu-run.sh.
# Usage: scripts/gpu-bundle.sh [build-dir] [archive]   (default build-gpu, gpu-bundle.tar.xz)
# There: tar xf gpu-bundle.tar.xz && kvcache-gpu/run.sh [out-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-build-gpu}"
archive="$(realpath -m "${2:-gpu-bundle.tar.xz}")"
tests=(kv_dequant_test kv_ops_test row_ops_test page_mirror_test device_matmul_test cuda_engine_test cuda_programs_test hbm_ipc_test)
bins=(kvgen kvmodel kvbench kvcached kvdemo)
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVC_CUDA=ON >/dev/null
cmake --build "$dir" -j "$(nproc)" --target "${tests[@]}" "${bins[@]}" >/dev/null
stage="$(mktemp -d)/kvcache-gpu"
mkdir -p "$stage/bin" "$stage/tests" "$stage/lib"
for t in "${tests[@]}"; do strip --strip-unneeded -o "$stage/tests/$t" "$dir/tests/$t"; done
for b in "${bins[@]}"; do strip --strip-unneeded -o "$stage/bin/$b" "$dir/bin/$b"; done
# Shared libraries: all but the C library family (the machine's own, newer, is compatible)
# and the driver / CUDA runtime libraries (taken from the machine).
for f in "$stage"/bin/* "$stage"/tests/*; do ldd "$f"; done | awk '$3 ~ /^\// { print $3 }' | sort -u |
  grep -vE '/(ld-linux[^/]*|libc|libm|libpthread|libdl|librt|libcuda|libcublas[^/]*|libcudart|libnvidia[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
cp -r configs "$stage/configs"
cp scripts/gpu-run.sh "$stage/"
cat >"$stage/run.sh" <<RUN
#!/usr/bin/env bash
# Runs the GPU checks from this bundle (see scripts/gpu-bundle.sh). Usage: run.sh [out-dir]
here="\$(cd "\$(dirname "\$0")" && pwd)"
cublas="\$(find /usr/local/cuda*/ /usr/lib /opt -name 'libcublas.so.13*' -print -quit 2>/dev/null || true)"
export LD_LIBRARY_PATH="\$here/lib:\${cublas:+\$(dirname "\$cublas")}:\${LD_LIBRARY_PATH:-}"
# The test programs read configs from the source folder they were built in and start
# kvcached from the build's bin folder: point those paths here where they are missing.
src="$(pwd)"
bindir="$(realpath -m "$dir")/bin"
if [ ! -e "\$src/configs/mini.json" ]; then mkdir -p "\$src" && ln -sfn "\$here/configs" "\$src/configs"; fi
if [ ! -x "\$bindir/kvcached" ]; then mkdir -p "\$(dirname "\$bindir")" && ln -sfn "\$here/bin" "\$bindir"; fi
exec "\$here/gpu-run.sh" "\$here/bin" "\$here/tests" "\$here/configs" "\${1:-\$here/out}"
RUN
chmod +x "$stage/run.sh"
tar -C "$(dirname "$stage")" -cJf "$archive" kvcache-gpu
rm -rf "$(dirname "$stage")"
echo "gpu-bundle: $archive ($(du -h "$archive" | cut -f1))"
