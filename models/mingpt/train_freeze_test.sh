#!/usr/bin/env bash
# --freeze (fine-tuning with some parameters fixed): //models/mingpt:train
# from a checkpoint with the token embedding and the first Block frozen. The
# frozen parameters end bitwise as the checkpoint had them, the others move;
# DDP, ZeRO-1 and FSDP (FULL_SHARD, whose first Block unit is then all
# frozen) at world 2 give one process's losses; a frozen run resumes with the
# uninterrupted run's losses (one process and FSDP); bad patterns exit 2
# naming --freeze.
set -euo pipefail
train="$1"
checkpoint="$2"
source "$3"  # models/common/cli_testing.sh: exits_2
source "$4"  # models/common/losses_testing.sh: same_losses
dir="${TEST_TMPDIR}/freeze"
mkdir -p "$dir"

common=(--data=shipped --seq_len=32 --batch_size=4 --log_every=1 --dropout=0 --lr=1e-2
        --weight_decay=0.1)
"$train" --preset=gpt-nano "${common[@]}" --steps=2 --checkpoint_dir="$dir/base" > /dev/null
freeze=(--init_from="$dir/base" --freeze=transformer.wte,transformer.h.0)

# One process: the start-up line, then the frozen tensors unchanged (max |a-b| 0).
"$train" "${common[@]}" "${freeze[@]}" --steps=3 --checkpoint_dir="$dir/one" \
  --metrics_out="$dir/one.jsonl" > "$dir/one.log"
grep -q "^frozen: transformer.wte, transformer.h.0 | 13 tensors, " "$dir/one.log" ||
  { cat "$dir/one.log"; exit 1; }
"$checkpoint" diff "$dir/one" "$dir/base" --top=0 > "$dir/diff.txt" || true
frozen_moved=$(awk '$1 ~ /^transformer\.(wte\.|h\.0\.)/ && $2 != 0' "$dir/diff.txt" | wc -l)
frozen_listed=$(awk '$1 ~ /^transformer\.(wte\.|h\.0\.)/' "$dir/diff.txt" | wc -l)
others_moved=$(awk '$1 ~ /^(transformer\.h\.[12]\.|lm_head)/ && $2 != 0' "$dir/diff.txt" | wc -l)
[[ $frozen_listed == 13 && $frozen_moved == 0 && $others_moved -gt 0 ]] ||
  { echo "frozen listed $frozen_listed, moved $frozen_moved; others moved $others_moved"; cat "$dir/diff.txt"; exit 1; }
echo "one process: the 13 frozen tensors are the checkpoint's, $others_moved others moved"

# Every strategy at world 2 gives one process's losses, and FSDP's frozen tensors stay too.
for strategy in ddp zero1 full_shard; do
  "$train" "${common[@]}" "${freeze[@]}" --steps=3 --batch_size=2 --world_size=2 \
    --strategy="$strategy" --checkpoint_dir="$dir/$strategy" \
    --metrics_out="$dir/$strategy.jsonl" > "$dir/$strategy.log"
  same_losses "$dir/one.jsonl" "$dir/$strategy.jsonl" "$strategy"
done
"$checkpoint" diff "$dir/full_shard" "$dir/base" --top=0 > "$dir/diff_fsdp.txt" || true
[[ $(awk '$1 ~ /^transformer\.(wte\.|h\.0\.)/ && $2 != 0' "$dir/diff_fsdp.txt" | wc -l) == 0 ]] ||
  { cat "$dir/diff_fsdp.txt"; exit 1; }
echo "DDP, ZeRO-1 and FSDP at world 2 train as one process; FSDP keeps the frozen tensors"

# Resume: 3 steps as 2 + 1 give the uninterrupted losses.
for dp in "" "--batch_size=2 --world_size=2 --strategy=full_shard"; do
  # shellcheck disable=SC2086  # $dp is several flags or none
  "$train" "${common[@]}" "${freeze[@]}" $dp --steps=2 --checkpoint_dir="$dir/r" \
    --checkpoint_every=2 > /dev/null
  # shellcheck disable=SC2086
  "$train" "${common[@]}" "${freeze[@]}" $dp --steps=3 --checkpoint_dir="$dir/r" --resume=latest \
    --metrics_out="$dir/r.jsonl" > /dev/null
  same_losses "$dir/one.jsonl" "$dir/r.jsonl" "resume ${dp:-one process}"
  rm -rf "$dir/r"
done
# ZeRO-1 with small buckets (the frozen ones communicate nothing and hold no
# state) saves; FSDP resumes from it.
"$train" "${common[@]}" "${freeze[@]}" --batch_size=2 --world_size=2 --strategy=zero1 \
  --bucket_cap_mb=0.05 --steps=2 --checkpoint_dir="$dir/z" > /dev/null
"$train" "${common[@]}" "${freeze[@]}" --batch_size=2 --world_size=2 --strategy=full_shard \
  --steps=3 --checkpoint_dir="$dir/z" --resume=latest --metrics_out="$dir/z.jsonl" > /dev/null
same_losses "$dir/one.jsonl" "$dir/z.jsonl" "ZeRO-1 small buckets -> FSDP"
echo "frozen runs resume with the uninterrupted losses"

# Unfreezing: one process resumes with fresh optimizer state for what was
# frozen; FSDP cannot form a flat state half of which was never stepped and
# says so, and --init_from of the step folder (weights, fresh optimizer) trains all.
dp=(--batch_size=2 --world_size=2 --strategy=full_shard)
"$train" "${common[@]}" "${freeze[@]}" --steps=2 --checkpoint_dir="$dir/u" > /dev/null
"$train" "${common[@]}" --init_from="$dir/base" --steps=3 --checkpoint_dir="$dir/u" \
  --resume=latest > /dev/null
"$train" "${common[@]}" "${freeze[@]}" "${dp[@]}" --steps=2 --checkpoint_dir="$dir/uf" > /dev/null
rc=0
"$train" "${common[@]}" "${dp[@]}" --init_from="$dir/base" --steps=3 \
  --checkpoint_dir="$dir/uf" --resume=latest > /dev/null 2> "$dir/uf.err" || rc=$?
[[ $rc != 0 ]] && grep -qF "a parameter frozen when it was saved has none" "$dir/uf.err" ||
  { echo "rc $rc"; cat "$dir/uf.err"; exit 1; }
"$train" "${common[@]}" "${dp[@]}" --steps=1 --init_from="$dir/uf/step_000002" > /dev/null
echo "unfreezing: one process resumes, FSDP names the way (--init_from)"

exits_2 "--freeze: freeze pattern 'transformer.wtx' selects no parameter" \
  "$train" "${common[@]}" --steps=1 --freeze=transformer.wtx
exits_2 "--freeze='*' freezes every parameter of the model: nothing would train" \
  "$train" "${common[@]}" --steps=1 --freeze='*'
exits_2 "--freeze='transformer.wte,,lm_head' has an empty pattern" \
  "$train" "${common[@]}" --steps=1 --world_size=2 --freeze=transformer.wte,,lm_head
echo "bad patterns exit 2 naming --freeze"
