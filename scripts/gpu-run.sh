#!/usr/bin/env bash
# The GPU checks on programs already built with the CUDA backend, most important first,
# inside a time budget (GPU_RUN_SECONDS, default 420: with the bundle's unpacking the whole
# check fits 8 minutes on one GPU): the parity suite (every kernel and the CUDA engine
# against the CPU), kvgen's CPU and CUDA backends on one prompt (their logits must be the
# same bits), the engine at the reference's layer shapes (configs/reference-shaped.json:
# prefill and decode tokens/s at 16K and 128K contexts), the TTFT of a resume through
# kvcached from RAM, HBM (over CUDA IPC) and SSD, the main job (kvdemo), `kvbench engine` and `kvbench
# kernels`, then compute-sanitizer with what time is left. A step that would not fit says
# so in its row. Prints one short table last; logs and full outputs go to OUT_DIR.
# Usage: scripts/gpu-run.sh BIN_DIR TEST_DIR CONFIG_DIR [OUT_DIR]
set -uo pipefail
bin="$1" tests="$2" configs="$3" out="${4:-gpu-check-out}"
mkdir -p "$out"
: >"$out/table.txt"
# Each result is printed as soon as it is known (a run cut short still shows what it
# got) and collected for the summary at the end.
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$out/table.txt"; }
deadline=$(( $(date +%s) + ${GPU_RUN_SECONDS:-420} ))
# budget CAP: the seconds a step may take — CAP, or what is left before the deadline
# (minus 10 s to print the table); 0 when under 20 s are left.
budget() {
  local left=$(( deadline - $(date +%s) - 10 ))
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi
}
# within CAP CMD...: CMD for at most `budget CAP` seconds; 125, not run, when it is spent.
within() {
  local t
  t=$(budget "$1")
  shift
  [ "$t" -eq 0 ] && return 125
  timeout "$t" "$@"
}
# verdict RC: a step's exit status in words.
verdict() {
  case $1 in
    0) echo ok ;;
    124) echo "timed out" ;;
    125) echo "not run: time budget spent" ;;
    *) echo "FAILED (rc $1)" ;;
  esac
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
      echo "nvidia-smi not found")
echo "gpu: $gpu" | tee "$out/gpu.txt"

# 1. Parity suite: one line per test program (passed / failed / skipped, failures named).
for t in kv_dequant_test kv_ops_test row_ops_test page_mirror_test device_matmul_test cuda_engine_test cuda_programs_test hbm_ipc_test; do
  start=$(date +%s)
  limit=$(budget 120)
  if [ "$limit" -eq 0 ]; then row "$t" "not run: time budget spent"; continue; fi
  timeout "$limit" "$tests/$t" >"$out/$t.log" 2>&1
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
  within 60 "$bin/kvgen" --config "$configs/mini.json" --weights "$out/mini.safetensors" \
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

# 2a. The engine at the reference's layer shapes (random weights, ~8.9 GB written and
# loaded first): per context, a CED prefill and then 16 greedy tokens decoded after it, on
# the CUDA backend. Each context's line is read from the log as it comes (a run cut short
# by the budget keeps the 16K row).
limit=$(budget 240)
if [ "$limit" -eq 0 ]; then
  row "reference-shaped engine (cuda)" "not run: time budget spent"
else
  # Its random weights go to a scratch folder under OUT_DIR, removed even after a timeout.
  mkdir -p "$out/scratch"
  TMPDIR="$out/scratch" timeout "$limit" "$bin/kvbench" engine \
    --config "$configs/reference-shaped.json" --backend cuda --contexts 16384,131072 \
    --decode-tokens 16 --json >"$out/reference-shaped.json" 2>"$out/reference-shaped.err"
  rc=$?
  rm -rf "$out/scratch"
  grep -E '^kvbench: context [0-9]+: prefill [0-9]' "$out/reference-shaped.err" |
    while read -r _ _ ctx rest; do
      row "reference-shaped, $((${ctx%:} / 1024))K context (cuda)" "$rest"
    done
  [ $rc -ne 0 ] && row "reference-shaped engine (cuda)" "$(verdict $rc) (reference-shaped.err)"
fi

# 2a'. TTFT of a resume through kvcached (mini config, CUDA engine): the cached prefix
# fetched from the RAM tier, read out of kvcached's HBM tier over CUDA IPC, and after a
# restart from SSD, beside a cold prefill.
limit=$(budget 120)
if [ "$limit" -eq 0 ]; then
  row "resume TTFT (cuda)" "not run: time budget spent"
else
  timeout "$limit" "$bin/kvbench" e2e --config "$configs/mini.json" --backend cuda \
    --dir "$out/e2e-scratch" --prefix-tokens 16384 --new-tokens 512 --new-token-sweep 512 \
    --sweep-prefix 16384 --reps 1 --hbm-bytes 1073741824 --json >"$out/e2e-cuda.json" \
    2>"$out/e2e-cuda.err"
  rc=$?
  for tier in ram hbm ssd; do
    line=$(tr -d ' \n' <"$out/e2e-cuda.json" | tr '{' '\n' | grep "\"tier\":\"$tier\"" | head -1)
    get() { echo "$line" | grep -oE "\"$1\":[0-9.e+-]+" | cut -d: -f2; }
    [ -n "$line" ] && row "resume 16K + 512 new from $tier (cuda)" \
      "TTFT $(get ttft_warm_ms) ms vs cold $(get ttft_cold_ms) ms"
  done
  [ $rc -ne 0 ] && row "kvbench e2e --backend cuda" "$(verdict $rc) (e2e-cuda.err)"
  rm -rf "$out/e2e-scratch"
fi

# 2b. The README's main job with the engine's products on the GPU: kvdemo (kvcached
# started beside it, a session resumed from the cache every turn, one restart).
if [ -x "$bin/kvdemo" ] && [ -e "$PWD/docs/storage.md" ]; then
  within 120 "$bin/kvdemo" --backend cuda --turns 3 --source-dir "$PWD" --json \
    >"$out/kvdemo-cuda.json" 2>"$out/kvdemo-cuda.err"
  rc=$?
  row "kvdemo --backend cuda (3 turns)" "$([ $rc -eq 0 ] && echo "ok (kvdemo-cuda.json)" || echo "FAILED (rc $rc, kvdemo-cuda.err)")"
fi

# 2c. The engine's speed on each backend (prefill CED and full depth, decode, resume).
for b in cpu cuda; do
  within 90 "$bin/kvbench" engine --config "$configs/mini.json" --backend "$b" \
    --prefill-tokens 2048,8192 --full-depth-max 2048 --resume-prefix 8192 --resume-new 512 \
    --reps 1 >"$out/engine-$b.txt" 2>&1
  rc=$?
  row "kvbench engine --backend $b" "$([ $rc -eq 0 ] && echo "ok (engine-$b.txt)" || echo "FAILED (rc $rc)")"
done

# 3. Kernel benchmarks (text table into the output; JSON beside it).
within 90 "$bin/kvbench" kernels --config "$configs/deepseek-v4.1-flash.config.json" \
  >"$out/kernels.txt" 2>&1
rc=$?
row "kvbench kernels" "$([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc)")"

# 4. The memory and race checkers over the kernel tests (never-run code: out-of-bounds
# reads, missing barriers), where compute-sanitizer exists and works.
san="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)"
if [ -n "$san" ]; then
  for check in "memcheck kv_ops_test" "memcheck row_ops_test" "memcheck kv_dequant_test" \
               "racecheck kv_ops_test" "memcheck device_matmul_test" "memcheck cuda_engine_test"; do
    set -- $check
    limit=$(budget 120)
    if [ "$limit" -eq 0 ]; then row "compute-sanitizer $1 $2" "not run: time budget spent"; continue; fi
    timeout "$limit" "$san" --tool "$1" --error-exitcode 9 "$tests/$2" >"$out/$1-$2.log" 2>&1
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
