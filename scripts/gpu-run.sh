#!/usr/bin/env bash
# The GPU checks on programs already built with the CUDA backend: the parity suite (every
# kernel and the CUDA engine against the CPU), kvgen's CPU and CUDA backends on one prompt
# (their logits must be the same bits), and `kvbench kernels`. Prints one short table
# last; logs and full outputs go to OUT_DIR.
# Usage: scripts/gpu-run.sh BIN_DIR TEST_DIR CONFIG_DIR [OUT_DIR]
set -uo pipefail
bin="$1" tests="$2" configs="$3" out="${4:-gpu-check-out}"
mkdir -p "$out"
: >"$out/table.txt"
# Each result is printed as soon as it is known (a run cut short still shows what it
# got) and collected for the summary at the end.
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$out/table.txt"; }

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
      echo "nvidia-smi not found")
echo "gpu: $gpu" | tee "$out/gpu.txt"

# 1. Parity suite: one line per test program (passed / failed / skipped, failures named).
for t in kv_dequant_test kv_ops_test row_ops_test page_mirror_test cuda_engine_test cuda_programs_test hbm_ipc_test; do
  start=$(date +%s)
  timeout 300 "$tests/$t" >"$out/$t.log" 2>&1
  rc=$?
  count() { grep -E "^\[ +$1 +\] [0-9]+ test" "$out/$t.log" | grep -oE '[0-9]+' | head -1; }
  summary="passed $(count PASSED || echo 0), skipped $(count SKIPPED || echo 0), $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ]; then
    failed=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$out/$t.log" | sed -E 's/^\[  FAILED  \] ([^ ]+).*/\1/' | sort -u | tr '\n' ' ')
    summary="FAILED (rc $rc): ${failed:-crashed, see $t.log}"
  fi
  row "$t" "$summary"
done

# 2. The engine end to end: kvgen on the CPU and on the GPU, same weights and prompt.
seed=$(( (RANDOM << 15) | RANDOM ))
echo "prompt seed $seed" >"$out/kvgen.txt"
awk -v s="$seed" 'BEGIN { srand(s); for (i = 0; i < 1500; ++i) printf "%d ", int(rand() * 512); print "" }' >"$out/prompt.txt"
"$bin/kvmodel" init --config "$configs/mini.json" --seed "$seed" --out "$out/mini.safetensors" >>"$out/kvgen.txt" 2>&1
for b in cpu cuda cublas; do
  "$bin/kvgen" --config "$configs/mini.json" --weights "$out/mini.safetensors" \
    --prompt "$out/prompt.txt" --max-new-tokens 16 --greedy --backend "$b" \
    --dump-logits "$out/logits-$b.bin" --json >"$out/kvgen-$b.json" 2>>"$out/kvgen.txt"
  echo "$b rc $?: $(cat "$out/kvgen-$b.json")" >>"$out/kvgen.txt"
done
if cmp -s "$out/logits-cpu.bin" "$out/logits-cuda.bin" && [ -s "$out/logits-cpu.bin" ]; then
  ttft() { grep -oE '"ttft_ms":[0-9.e+-]+' "$out/kvgen-$1.json" | cut -d: -f2; }
  row "kvgen cpu vs cuda (1500 tokens, 16 new)" "logits bit-identical; TTFT cpu $(ttft cpu) ms, cuda $(ttft cuda) ms"
else
  row "kvgen cpu vs cuda (1500 tokens, 16 new)" "DIFFER or failed (see kvgen.txt)"
fi
gen() { grep -oE '"generated":\[[0-9,]*\]' "$out/kvgen-$1.json"; }
if [ -n "$(gen cublas)" ]; then
  ttft() { grep -oE '"ttft_ms":[0-9.e+-]+' "$out/kvgen-$1.json" | cut -d: -f2; }
  row "kvgen cublas" "$([ "$(gen cublas)" = "$(gen cpu)" ] && echo "same tokens as cpu" || echo "OTHER tokens than cpu"); TTFT $(ttft cublas) ms"
else
  row "kvgen cublas" "failed (see kvgen.txt)"
fi

# 2b. The README's main job with the engine's products on the GPU: kvdemo (kvcached
# started beside it, a session resumed from the cache every turn, one restart).
if [ -x "$bin/kvdemo" ] && [ -e "$PWD/docs/storage.md" ]; then
  timeout 300 "$bin/kvdemo" --backend cuda --turns 3 --source-dir "$PWD" --json \
    >"$out/kvdemo-cuda.json" 2>"$out/kvdemo-cuda.err"
  rc=$?
  row "kvdemo --backend cuda (3 turns)" "$([ $rc -eq 0 ] && echo "ok (kvdemo-cuda.json)" || echo "FAILED (rc $rc, kvdemo-cuda.err)")"
fi

# 2c. The engine's speed on each backend (prefill CED and full depth, decode, resume).
for b in cpu cuda; do
  timeout 300 "$bin/kvbench" engine --config "$configs/mini.json" --backend "$b" \
    --prefill-tokens 2048,8192 --full-depth-max 2048 --resume-prefix 8192 --resume-new 512 \
    --reps 1 >"$out/engine-$b.txt" 2>&1
  rc=$?
  row "kvbench engine --backend $b" "$([ $rc -eq 0 ] && echo "ok (engine-$b.txt)" || echo "FAILED (rc $rc)")"
done

# 3. Kernel benchmarks (text table into the output; JSON beside it).
timeout 300 "$bin/kvbench" kernels --config "$configs/deepseek-v4.1-flash.config.json" \
  >"$out/kernels.txt" 2>&1
rc=$?
row "kvbench kernels" "$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)")"

# 4. The memory and race checkers over the kernel tests (never-run code: out-of-bounds
# reads, missing barriers), where compute-sanitizer exists and works.
san="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)"
if [ -n "$san" ]; then
  for check in "memcheck kv_ops_test" "memcheck row_ops_test" "memcheck kv_dequant_test" \
               "racecheck kv_ops_test" "memcheck cuda_engine_test"; do
    set -- $check
    timeout 240 "$san" --tool "$1" --error-exitcode 9 "$tests/$2" >"$out/$1-$2.log" 2>&1
    rc=$?
    case $rc in
      0) verdict="clean" ;;
      9) verdict="ERRORS (see $1-$2.log)" ;;
      124) verdict="timed out" ;;
      *) verdict="could not run (rc $rc, see $1-$2.log)" ;;
    esac
    row "compute-sanitizer $1 $2" "$verdict"
  done
else
  row "compute-sanitizer" "not found"
fi

echo
cat "$out/engine-cpu.txt" "$out/engine-cuda.txt" "$out/kernels.txt" 2>/dev/null
echo
cat "$out/table.txt"
