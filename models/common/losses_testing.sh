# Shell helpers of the train-binary tests that compare runs' losses (sourced).
# losses FILE: "step loss" per line of a --metrics_out JSON-lines file.
losses() { sed -E 's/.*"step":([0-9]+),"loss":([0-9.]+).*/\1 \2/' "$1"; }
# same_losses WANT GOT NAME: every step of GOT is in WANT with a loss within
# 1e-5 relative (the JSON keeps 6 decimals; world sizes sum in other orders).
same_losses() {
  local n
  n=$(losses "$2" | wc -l)
  [[ $n -ge 1 ]] || { echo "$3: no steps in $2"; exit 1; }
  join <(losses "$1") <(losses "$2") | awk -v s="$3" -v n="$n" '
    { d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 * $2 + 2e-6) { print s ": step " $1 " want " $2 " got " $3; bad = 1 } m++ }
    END { if (m != n) { print s ": steps missing"; bad = 1 } exit bad }'
}
# eval_loss FILE: the last evaluation loss of a --metrics_out JSON-lines file.
eval_loss() { sed -nE 's/.*"step":([0-9]+),"eval_loss":([0-9.]+).*/\2/p' "$1" | tail -1; }
# close_to A B: |A - B| <= 1e-5 |B|, else the test stops showing both.
close_to() {
  awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * b) }' ||
    { echo "$1 vs $2"; exit 1; }
}
