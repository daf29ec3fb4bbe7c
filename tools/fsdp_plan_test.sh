#!/usr/bin/env bash
# //tools:fsdp_plan --freeze: the trainable count, the frozen units (T5's
# shared embedding kept in the root unit), less model state than with
# everything training, and a pattern that selects nothing exits 2. Layouts
# training refuses (T5's tied shared.weight outside the root unit) and
# --max_inflight_all_gathers < 1 exit 2 too. Nested units (size:N) name the unit they sit in.
# --grad_accum_steps > 1 keeps every unit's unsharded gradient (no_sync); --prefetch_units and
# --keep_last_unit as the train binaries' flags; --sample_every with the whole model gathered.
set -euo pipefail
plan="$1"
source "$2"  # models/common/cli_testing.sh: exits_2
state() { awk '$1 == 8 { print $4 }' "$1"; }  # state GiB at world 8
"$plan" --preset=gpt2 --world_sizes=8 > "${TEST_TMPDIR}/all.txt"
"$plan" --preset=gpt2 --world_sizes=8 --freeze=transformer.wte,transformer.h.0 --units \
  > "${TEST_TMPDIR}/frozen.txt"
grep -q "parameters: 163037184, 117351936 trainable" "${TEST_TMPDIR}/frozen.txt" ||
  { cat "${TEST_TMPDIR}/frozen.txt"; exit 1; }
grep -qE "^ +transformer\.wte .*per rank \(frozen\)$" "${TEST_TMPDIR}/frozen.txt"
grep -qE "^ +transformer\.h\.0 .*per rank \(frozen\)$" "${TEST_TMPDIR}/frozen.txt"
[[ $(grep -c "(frozen)" "${TEST_TMPDIR}/frozen.txt") == 2 ]]
awk -v a="$(state "${TEST_TMPDIR}/frozen.txt")" -v b="$(state "${TEST_TMPDIR}/all.txt")" \
  'BEGIN { exit !(a < b) }' || { echo "state $(state "${TEST_TMPDIR}/frozen.txt") vs $(state "${TEST_TMPDIR}/all.txt")"; exit 1; }
"$plan" --preset=t5-small --world_sizes=8 --freeze=shared,encoder --units > "${TEST_TMPDIR}/t5.txt"
grep -qE "^ +<root> +2 params" "${TEST_TMPDIR}/t5.txt" || { cat "${TEST_TMPDIR}/t5.txt"; exit 1; }
exits_2 "--freeze: freeze pattern 'nope' selects no parameter" "$plan" --preset=gpt-nano --freeze=nope
exits_2 "--world_sizes='8, ,64' has an empty entry" "$plan" --preset=gpt-nano --world_sizes="8, ,64"
exits_2 "--world_sizes is empty" "$plan" --preset=gpt-nano --world_sizes=
# size:1000000 makes T5's shared embedding a unit: //models/t5:train refuses it, so does the plan.
exits_2 "--auto_wrap=size:1000000 puts 'shared.weight' into the FSDP unit 'shared', but it must \
stay in the root unit" "$plan" --preset=t5-small --auto_wrap=size:1000000
exits_2 "puts 'shared.weight' into the FSDP unit" \
  "$plan" --preset=t5-small --auto_wrap=size:1000000 --freeze=encoder
"$plan" --preset=t5-small --world_sizes=8 --auto_wrap=none > /dev/null
"$plan" --preset=t5-tiny --world_sizes=2 > /dev/null  # //models/t5:train's default
exits_2 "--preset: unknown preset 'gpt-9'; minGPT: gpt-nano," "$plan" --preset=gpt-9
exits_2 "; T5: t5-tiny, t5-small," "$plan" --preset=gpt-9
# no tied weight; size:N wraps the transformer and large modules inside it: nested units
# are listed as such.
"$plan" --preset=gpt2 --world_sizes=8 --auto_wrap=size:1000000 --units > "${TEST_TMPDIR}/nested.txt"
grep -qE "^ +transformer\.h\.0\.mlp\.c_fc .*per rank \(inside transformer\)$" \
  "${TEST_TMPDIR}/nested.txt" || { cat "${TEST_TMPDIR}/nested.txt"; exit 1; }
exits_2 "--max_inflight_all_gathers=0 must be >= 1" "$plan" --preset=gpt-nano \
  --max_inflight_all_gathers=0
exits_2 "--max_inflight_all_gathers=-1 must be >= 1" "$plan" --preset=gpt-nano \
  --max_inflight_all_gathers=-1
"$plan" --preset=gpt-nano --world_sizes=8 --max_inflight_all_gathers=1 > /dev/null
# Gradient accumulation (no_sync): every unit's unsharded gradient is kept (fp32 of all 163M
# parameters, padding aside), more than the synced step's window of units; the model state
# does not change.
grads() { awk '$1 == 8 { print $6 }' "$1"; }  # unsharded gradients GiB at world 8
"$plan" --preset=gpt2 --world_sizes=8 --grad_accum_steps=4 > "${TEST_TMPDIR}/accum.txt"
grep -q "4 micro-batches: every unit's gradient kept (no_sync)" "${TEST_TMPDIR}/accum.txt" ||
  { cat "${TEST_TMPDIR}/accum.txt"; exit 1; }
awk -v a="$(grads "${TEST_TMPDIR}/accum.txt")" -v b="$(grads "${TEST_TMPDIR}/all.txt")" \
  'BEGIN { exit !(a > b && a - 4 * 163037184 / 2^30 < 0.001 && a >= 0.607) }' ||
  { echo "grads $(grads "${TEST_TMPDIR}/accum.txt") vs $(grads "${TEST_TMPDIR}/all.txt")"; exit 1; }
[[ $(state "${TEST_TMPDIR}/accum.txt") == $(state "${TEST_TMPDIR}/all.txt") ]]
exits_2 "--grad_accum_steps=0 must be >= 1" "$plan" --preset=gpt-nano --grad_accum_steps=0
# Explicit prefetch of 3 neighbours: 4 units in flight against 2, more unsharded parameters;
# the last unit kept: gpt2's blocks are alike, so the same peak as without (it is the unit
# running when its backward starts).
params() { awk '$1 == 8 { print $5 }' "$1"; }  # unsharded parameters GiB at world 8
"$plan" --preset=gpt2 --world_sizes=8 --prefetch_units=3 > "${TEST_TMPDIR}/prefetch.txt"
grep -q "explicit prefetch: 4 units in flight" "${TEST_TMPDIR}/prefetch.txt" ||
  { cat "${TEST_TMPDIR}/prefetch.txt"; exit 1; }
awk -v a="$(params "${TEST_TMPDIR}/prefetch.txt")" -v b="$(params "${TEST_TMPDIR}/all.txt")" \
  'BEGIN { exit !(a > b) }' ||
  { echo "params $(params "${TEST_TMPDIR}/prefetch.txt") vs $(params "${TEST_TMPDIR}/all.txt")"; exit 1; }
"$plan" --preset=gpt2 --world_sizes=8 --keep_last_unit --json > "${TEST_TMPDIR}/kept.json"
grep -q '"keep_last_unit":true' "${TEST_TMPDIR}/kept.json" || { cat "${TEST_TMPDIR}/kept.json"; exit 1; }
exits_2 "--prefetch_units=-1 must be >= 0" "$plan" --preset=gpt-nano --prefetch_units=-1
exits_2 "--prefetch_units=2 prefetches that many units ahead in place of \
--max_inflight_all_gathers=1, which it would ignore" \
  "$plan" --preset=gpt-nano --prefetch_units=2 --max_inflight_all_gathers=1
exits_2 "--keep_last_unit: --auto_wrap=none gives no unit but the root" \
  "$plan" --preset=gpt-nano --auto_wrap=none --keep_last_unit
# Refused before anything is printed: a --freeze that leaves nothing to train
# (as the train binaries refuse it), --keep_last_unit with no trainable unit
# but the root, a world size past an int.
for bad in "--freeze=transformer,lm_head" "--keep_last_unit --freeze=transformer" \
           "--world_sizes=99999999999"; do
  # shellcheck disable=SC2086
  "$plan" --preset=gpt-nano $bad > "${TEST_TMPDIR}/bad.out" 2> "${TEST_TMPDIR}/bad.err" &&
    { echo "accepted: $bad"; exit 1; }
  [[ ! -s "${TEST_TMPDIR}/bad.out" ]] ||
    { echo "$bad printed:"; cat "${TEST_TMPDIR}/bad.out"; exit 1; }
done
exits_2 "--freeze='transformer,lm_head' freezes every parameter of the model: nothing would train" \
  "$plan" --preset=gpt-nano --freeze=transformer,lm_head
exits_2 "--world_sizes: '99999999999' is not an integer in [1, 2147483647]" \
  "$plan" --preset=gpt-nano --world_sizes=99999999999
# --json --units: one JSON object per world size, its units inside.
"$plan" --preset=gpt-nano --world_sizes=2,4 --json --units > "${TEST_TMPDIR}/units.json"
python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert [r["world_size"] for r in rows] == [2, 4], rows
assert all(len(r["unit_list"]) == r["units"] for r in rows), rows
assert rows[0]["unit_list"][0]["name"] == "" and rows[0]["unit_list"][1]["trains"], rows
' "${TEST_TMPDIR}/units.json" || { cat "${TEST_TMPDIR}/units.json"; exit 1; }
# The train binaries' flags that change the memory: --strategy, --vocab_size (T5: before
# --num_sentinels), --v1_1, and their default precision (fp32). The figures are the ledger's,
# measured by the train binaries with the same flags (rank 0's parameters peak: shards plus
# the unsharded peak): t5-small at world 4 under shard_grad_op holds every unit gathered
# (302533120 bytes against full_shard's 159876608); t5-tiny --v1_1 --vocab_size=32028 at
# world 2 54337536; gpt-nano --vocab_size=65536 at world 2 38181984.
param_bytes() {
  python3 -c 'import json, sys
r = json.loads(open(sys.argv[1]).readline())
print(4 * r["elements_per_rank"] + r["unsharded_parameters_peak_bytes"], r["strategy"],
      r["precision"])' "$1"
}
"$plan" --preset=t5-small --world_sizes=4 --strategy=shard_grad_op --json \
  > "${TEST_TMPDIR}/sgo.json"
[[ $(param_bytes "${TEST_TMPDIR}/sgo.json") == "302533120 shard_grad_op fp32" ]] ||
  { cat "${TEST_TMPDIR}/sgo.json"; exit 1; }
"$plan" --preset=t5-small --world_sizes=4 --json > "${TEST_TMPDIR}/fs.json"
[[ $(param_bytes "${TEST_TMPDIR}/fs.json") == "159876608 full_shard fp32" ]] ||
  { cat "${TEST_TMPDIR}/fs.json"; exit 1; }
"$plan" --preset=t5-tiny --world_sizes=2 --v1_1 --vocab_size=32028 --json \
  > "${TEST_TMPDIR}/v11.json"
[[ $(param_bytes "${TEST_TMPDIR}/v11.json") == "54337536 full_shard fp32" ]] ||
  { cat "${TEST_TMPDIR}/v11.json"; exit 1; }
"$plan" --preset=gpt-nano --world_sizes=2 --vocab_size=65536 --json > "${TEST_TMPDIR}/vocab.json"
[[ $(param_bytes "${TEST_TMPDIR}/vocab.json") == "38181984 full_shard fp32" ]] ||
  { cat "${TEST_TMPDIR}/vocab.json"; exit 1; }
"$plan" --preset=gpt-nano --world_sizes=2 --strategy=hybrid_shard > "${TEST_TMPDIR}/hybrid.txt"
grep -q "^gpt-nano | hybrid_shard (world: the shard group) | auto_wrap transformer | fp32 compute" \
  "${TEST_TMPDIR}/hybrid.txt" || { cat "${TEST_TMPDIR}/hybrid.txt"; exit 1; }
exits_2 "--strategy='no_shard' is not one of full_shard, shard_grad_op, hybrid_shard, \
hybrid_shard_zero2 (no_shard holds at most what shard_grad_op plans at --world_sizes=1" \
  "$plan" --preset=gpt-nano --strategy=no_shard
exits_2 "--keep_last_unit keeps a unit FULL_SHARD or HYBRID_SHARD would reshard after its \
forward; --strategy=hybrid_shard_zero2 reshards none" \
  "$plan" --preset=gpt-nano --strategy=hybrid_shard_zero2 --keep_last_unit
exits_2 "--v1_1 is a T5 form; --preset is minGPT's" "$plan" --preset=gpt-nano --v1_1
for bad in "--preset=gpt-nano --vocab_size=300" "--preset=t5-tiny"; do
  # shellcheck disable=SC2086
  exits_2 "--num_sentinels adds T5's sentinels to a --vocab_size given" "$plan" $bad \
    --num_sentinels=10
done
# T5: --vocab_size before --num_sentinels (100 unless given); --precision as the train binaries
# spell it (fp16's unsharded copies are bf16's size).
t5_params() { "$plan" --preset=t5-tiny --world_sizes=2 --json "$@" | python3 -c \
  'import json, sys; print(json.loads(sys.stdin.readline())["parameters"])'; }
[[ $(( $(t5_params --vocab_size=356) - $(t5_params --vocab_size=356 --num_sentinels=0) )) == \
   $(( 100 * 128 )) ]]  # 100 more rows of d_model 128 (the tied shared embedding)
p16=$("$plan" --preset=gpt-nano --world_sizes=2 --precision=float16 --json)
pbf=$("$plan" --preset=gpt-nano --world_sizes=2 --precision=bfloat16 --json)
[[ $p16 == *'"precision":"fp16"'* && $pbf == *'"precision":"bf16"'* &&
   ${p16#*unsharded_parameters_peak_bytes} == ${pbf#*unsharded_parameters_peak_bytes} ]] ||
  { echo "$p16"; echo "$pbf"; exit 1; }
exits_2 "--precision: unknown precision 'fp8'; expected fp32, bf16 or fp16" "$plan" \
  --preset=gpt-nano --precision=fp8
exits_2 "--vocab_size=-1 and --num_sentinels=100 must be >= 0" "$plan" --preset=gpt-nano \
  --vocab_size=-1
# size:N wraps T5's shared embedding whenever it wraps anything smaller: the refusal says so.
exits_2 "use --auto_wrap=transformer (a size:N keeps it in the root only for N above 16449536, \
the parameters of 'shared', and then wraps only modules larger than that)" \
  "$plan" --preset=t5-small --auto_wrap=size:1000000
# --sample_every with --sample_gather=model: a sample holds the state and the whole model
# (4 bytes an element at world 1, where nothing is padded), and the total is the larger peak;
# gathered by unit it adds nothing to plan.
sample_json() { "$plan" --preset=gpt-nano --world_sizes=1 --json "$@" | python3 -c \
  'import json, sys; j = json.loads(sys.stdin.readline())
print(j.get("sample_peak_bytes", "none"), j["model_state_bytes"], j["parameters"], j["peak_bytes"])'; }
read -r sample state params peak <<< "$(sample_json --sample_every=10)"
[[ $sample == $(( state + 4 * params )) ]] || { echo "sample $sample: $state + 4 x $params?"; exit 1; }
read -r _ _ _ step_peak <<< "$(sample_json)"
[[ $peak == $(( sample > step_peak ? sample : step_peak )) ]] ||
  { echo "peak $peak: the step's $step_peak or the sample's $sample"; exit 1; }
unit=$(sample_json --sample_every=10 --sample_gather=unit)
[[ $unit == "none $state $params $step_peak" ]] || { echo "gathered by unit: $unit"; exit 1; }
# gpt-175b sampled with the whole model gathered: the sample is the peak, far above the step's.
"$plan" --preset=gpt-175b --world_sizes=1024 --precision=bf16 --sample_every=100 \
  > "${TEST_TMPDIR}/sampled.txt"
grep -q "a sample every 100 steps, the whole model gathered" "${TEST_TMPDIR}/sampled.txt"
awk '$1 == 1024 { exit !($7 == $8 && $8 > 300) }' "${TEST_TMPDIR}/sampled.txt" ||
  { cat "${TEST_TMPDIR}/sampled.txt"; exit 1; }
exits_2 "--sample_every must be >= 0 (0: no samples), got -1" "$plan" --preset=gpt-nano \
  --sample_every=-1
exits_2 "--sample_gather must be model or unit, got 'all'" "$plan" --preset=gpt-nano \
  --sample_every=1 --sample_gather=all
exits_2 "--sample_gather=unit without --sample_every" "$plan" --preset=gpt-nano --sample_gather=unit
echo "fsdp_plan: frozen units, less state, no_sync, prefetch, kept unit, strategies, vocabulary, \
samples, errors named"
