#!/usr/bin/env bash
# compute-sanitizer's memcheck, racecheck and synccheck over every case of benchmarks/sanitize.py, and initcheck once
# per case (so each finding is attributed to a case and a kernel). Needs a CUDA GPU, the GPU install of the README
# and compute-sanitizer on PATH.
#
#   bash benchmarks/sanitize.sh            # logs and summary.txt under $OUT (default ./sanitize-out)
#   INITCHECK_CASES="conv-channel-last-fwd bf16-seq_idx" bash benchmarks/sanitize.sh   # initcheck on these only
#   CASES="bf16-d_conv2 bf16-states" bash benchmarks/sanitize.sh   # every tool on these cases only
#
# PYTORCH_NO_CUDA_MEMORY_CACHING=1 gives every tensor its own cudaMalloc, so the checker sees tensor bounds.
# summary.txt: one line per tool ("memcheck: 0 errors"), then per initcheck case the number of findings and the
# kernels they are in (from the first 1000 printed). Exit status 0 when memcheck, racecheck and synccheck found
# nothing and every case ran; initcheck's findings are listed, not judged (docs/guarantees.md explains them).
set -u
OUT=${OUT:-./sanitize-out}
mkdir -p "$OUT"
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/ordered-ssd-sanitize-triton}
status=0
cases=${CASES:-$(python benchmarks/sanitize.py --list)}
case_args=()
for c in $cases; do case_args+=(--case "$c"); done
if ! python benchmarks/sanitize.py "${case_args[@]}" > "$OUT/plain.log" 2>&1; then  # also compiles every kernel once
  echo "sanitize.sh: the cases fail without the sanitizer"; tail -n 20 "$OUT/plain.log"; exit 1
fi
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool "$tool" --error-exitcode 9 --print-limit 100 python benchmarks/sanitize.py \
    "${case_args[@]}" > "$OUT/$tool.log" 2>&1 &
done
initcheck_cases=${INITCHECK_CASES:-$cases}
for c in $initcheck_cases; do
  compute-sanitizer --tool initcheck --print-limit 1000 python benchmarks/sanitize.py --case "$c" \
    > "$OUT/initcheck-$c.log" 2>&1 &
  while [ "$(jobs -r | wc -l)" -ge 8 ]; do sleep 1; done
done
wait
: > "$OUT/summary.txt"
for tool in memcheck racecheck synccheck; do
  line=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -n 1)
  ran=$(grep -c "^sanitize: .* ran$" "$OUT/$tool.log")
  echo "$tool: ${line#========= } ($ran cases ran)" >> "$OUT/summary.txt"
  grep -qE "ERROR SUMMARY: 0 errors|0 hazards displayed \(0 errors, 0 warnings\)" "$OUT/$tool.log" || status=1
  [ "$ran" -eq "$(echo "$cases" | wc -w)" ] || status=1
done
for c in $initcheck_cases; do
  log="$OUT/initcheck-$c.log"
  n=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$log" | grep -oE "[0-9]+" | tail -n 1)
  grep -q "^sanitize: $c ran$" "$log" || status=1
  kernels=$(grep -A1 "Uninitialized __global__ memory read" "$log" | grep -oE "at (void )?[A-Za-z_][A-Za-z0-9_:]*" \
    | sed -E 's/^at (void )?//' | sort | uniq -c | sort -rn | awk '{printf "%s x%s; ", $2, $1}')
  echo "initcheck $c: ${n:-?} findings ${kernels:+in $kernels}" >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt"
exit $status
