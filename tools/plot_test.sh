#!/usr/bin/env bash
# tools/plot.py on sample outputs of //tools:bench_memory, //tools:bench_throughput,
# tools/bench_vs_pytorch.py (made-up figures) and train --metrics_out: well-formed SVG whose bars and lines follow the data
# (bar heights proportional to the values, DDP > FULL_SHARD > FULL_SHARD+wrap as in
# the sample, one line per run with a point per step), and its errors (exit 2).
set -euo pipefail
plot=$1 mem=$2 thr=$3 ddp=$4 fsdp=$5 speed=$6
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$plot" memory "$mem" --out "$out/mem.svg" | grep -q "wrote $out/mem.svg" || fail "memory"
python3 - "$out/mem.svg" "$mem" <<'PY' || fail "memory chart"
import json, re, sys
import xml.etree.ElementTree as ET
ns = {"s": "http://www.w3.org/2000/svg"}
root = ET.parse(sys.argv[1]).getroot()
data = json.load(open(sys.argv[2]))
# One titled bar per row: "<strategy>, N = <n>: peak <MiB> MiB, ..." in its panel.
bars = {}
for r in root.iter("{http://www.w3.org/2000/svg}rect"):
    t = r.find("s:title", ns)
    if t is None:
        continue
    m = re.match(r"(.+), N = (\d+): peak ([\d.]+) MiB", t.text)
    assert m, t.text
    bars.setdefault((m.group(1), int(m.group(2))), []).append((float(m.group(3)), float(r.get("height"))))
assert sum(len(v) for v in bars.values()) == len(data["rows"]), (len(bars), len(data["rows"]))
# The sample's ordering, which the chart shows.
panels = {}
for row in data["rows"]:
    panels.setdefault((row["preset"], row["precision"]), {})[(row["strategy"], row["world_size"])] = row["peak_bytes"]["total"]
for (preset, prec), peaks in panels.items():
    for n in {k[1] for k in peaks}:
        assert peaks[("DDP", n)] > peaks[("FULL_SHARD+wrap", n)], (preset, prec, n)
        assert peaks[("FULL_SHARD", n)] > peaks[("FULL_SHARD+wrap", n)], (preset, prec, n)
titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
for want in ("gpt-mini, fp32", "gpt-mini, bf16", "N = 2", "N = 4", "FULL_SHARD+wrap", "model state between steps"):
    assert want in titles, want
# Bars standing on one baseline (a panel): a taller peak is a taller bar, and
# heights are proportional to the peaks.
by_panel = {}
for r in root.iter("{http://www.w3.org/2000/svg}rect"):
    t = r.find("s:title", ns)
    if t is not None:
        by_panel.setdefault(round(float(r.get("y")) + float(r.get("height"))), []).append(
            (float(re.search(r"peak ([\d.]+)", t.text).group(1)), float(r.get("height"))))
for base, v in by_panel.items():
    v.sort()
    for (p1, h1), (p2, h2) in zip(v, v[1:]):
        assert (p1 < p2) == (h1 < h2) or abs(p1 - p2) < 0.05, (p1, h1, p2, h2)
    k = v[-1][1] / v[-1][0]
    assert all(abs(h - p * k) <= 0.01 * h + 0.2 for p, h in v), v
PY
echo "memory: bars follow the peaks"

python3 "$plot" throughput "$thr" --out "$out/thr.svg" > /dev/null
python3 - "$out/thr.svg" "$thr" <<'PY' || fail "throughput chart"
import json, re, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
data = json.load(open(sys.argv[2]))
rows = data["rows"]
S = "{http://www.w3.org/2000/svg}"
# A titled bar per row, in the file's order (fp32 then bf16), its height
# proportional to the median on the preset's one scale; bf16 bars name their
# ratio to fp32.
bars = [(r.find(S + "title").text, float(r.get("height"))) for r in root.iter(S + "rect")
        if r.find(S + "title") is not None]
assert len(bars) == len(rows) == 8, (len(bars), len(rows))
for (title, height), row in zip(bars, rows):
    assert title.startswith(f"{row['strategy']}: median {row['median_ms']:.1f} ms"), (title, row)
    assert ("of fp32" in title) == (row["precision"] == "bf16"), title
    if row["precision"] == "bf16":
        assert f"{row['over_fp32']:.3f} of fp32" in title, title
k = bars[0][1] / rows[0]["median_ms"]
assert all(abs(h - r["median_ms"] * k) < 0.01 * h + 0.2 for (_, h), r in zip(bars, rows))
assert len(list(root.iter(S + "circle"))) == sum(len(r["step_ms"]) for r in rows)  # a dot per step
texts = [t.text for t in root.iter(S + "text")]
for r in rows:
    assert any(f"({r['over_ddp']:.3f} of DDP)" in t for t in texts), r
assert "gpt-nano, fp32" in texts and "gpt-nano, bf16" in texts, texts
PY
# A file from before the precision field: one panel per preset.
python3 - "$thr" "$out/thr_old.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["rows"] = [{k: v for k, v in r.items() if k not in ("precision", "over_fp32", "over_fp32_paired_median")}
             for r in d["rows"] if r["precision"] == "fp32"]
json.dump(d, open(sys.argv[2], "w"))
PY
python3 "$plot" throughput "$out/thr_old.json" --out "$out/thr_old.svg" > /dev/null
grep -q '>gpt-nano<' "$out/thr_old.svg" || fail "a file without precisions: panel named by its preset"
echo "throughput: a bar per strategy and precision, a dot per step, ratios to DDP and to fp32"

python3 "$plot" loss "$ddp" "$fsdp" --labels ddp,fsdp --out "$out/loss.svg" > /dev/null
python3 - "$out/loss.svg" <<'PY' || fail "loss chart"
import sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
S = "{http://www.w3.org/2000/svg}"
lines = list(root.iter(S + "polyline"))
assert len(lines) == 4, len(lines)  # loss and tokens/s of each run
assert [len(l.get("points").split()) for l in lines] == [4, 3, 4, 3]
loss = [[float(p.split(",")[1]) for p in l.get("points").split()] for l in lines[::2]]
assert all(a < b for a, b in zip(loss[0], loss[0][1:])), "the loss falls, so y pixels rise"
texts = [t.text for t in root.iter(S + "text")]
assert "ddp" in texts and "fsdp" in texts
PY
echo "loss: a line per run, a point per step (the evaluation line skipped)"

# (The speed sample's figures are made up: a fixture of the JSON's form only.)
python3 "$plot" speed "$speed" --out "$out/speed.svg" > /dev/null
python3 - "$out/speed.svg" <<'PY' || fail "speed chart"
import re, sys
import xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
S = "{http://www.w3.org/2000/svg}"
bars = {}
for r in root.iter(S + "rect"):
    t = r.find(S + "title")
    if t is not None:
        m = re.match(r"(\w+): ([\d.]+) tokens/s", t.text)
        bars[m.group(1)] = (float(m.group(2)), float(r.get("height")), float(r.get("y")) + float(r.get("height")))
assert sorted(bars) == ["ours_bf16", "pytorch_autocast_bf16", "pytorch_autocast_bf16_sdpa"], bars
k = bars["ours_bf16"][1] / bars["ours_bf16"][0]
assert all(abs(h - v * k) < 0.5 for v, h, _ in bars.values()), bars
# The target line sits at 1.2x the eager run's tokens/s.
base = bars["pytorch_autocast_bf16"][2]
dashed = [l for l in root.iter(S + "line") if l.get("stroke-dasharray") and float(l.get("x2")) > 100]
assert len(dashed) == 1 and abs(base - float(dashed[0].get("y1")) - 1.2 * 180000 * k) < 0.5, dashed
texts = [t.text for t in root.iter(S + "text")]
assert "MFU 46.9%" in texts and "270000 (1.50x)" in texts, texts
PY
echo "speed: bars proportional to tokens/s, the 1.2x target line, MFU"

expect2() {  # expect2 PATTERN ARGS...
  local pattern=$1
  shift
  set +e
  python3 "$plot" "$@" > "$out/err.txt" 2>&1
  local code=$?
  set -e
  [[ $code == 2 ]] && grep -q -- "$pattern" "$out/err.txt" ||
    { echo "expected exit 2 and '$pattern' from $*; got $code:"; cat "$out/err.txt"; exit 1; }
}
# Losses close together: tick labels with the decimals their step needs, each
# distinct (10.7 printed twice while labels had 3 significant digits).
python3 - "$ddp" "$out/close.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as f:
    for i, r in enumerate(rows):
        r["loss"] = 10.67 + 0.16 * i / max(1, len(rows) - 1)
        f.write(json.dumps(r) + "\n")
PY
python3 "$plot" loss "$out/close.jsonl" --out "$out/close.svg" > /dev/null
python3 - "$out/close.svg" <<'PY' || fail "close ticks"
import re, sys
labels = re.findall(r'text-anchor="end"[^>]*>([0-9.]+)<', open(sys.argv[1]).read())
labels = [l for l in labels if l.startswith("10.")]
assert len(labels) >= 3 and len(set(labels)) == len(labels), labels
PY
echo "close losses: distinct tick labels"

expect2 "cannot read '$out/none.json'" memory "$out/none.json" --out "$out/x.svg"
printf '{"rows": [' > "$out/bad.json"
expect2 "is not JSON" memory "$out/bad.json" --out "$out/x.svg"
expect2 "a row lacks \"peak_bytes\"" memory "$thr" --out "$out/x.svg"
expect2 "is not JSON (Extra data at line 2)" throughput "$ddp" --out "$out/x.svg"
echo '{"steps": 3}' > "$out/other.json"
expect2 "has no \"rows\" list: not the --json_out of //tools:bench_throughput" throughput "$out/other.json" --out "$out/x.svg"
expect2 "line 1 lacks \"step\" or \"loss\"" loss "$thr" --out "$out/x.svg"
printf '{"step":1,"loss":5.5}\n{"step":2,"loss":NaN}\n' > "$out/nan.jsonl"
expect2 "line 2: step 2, loss nan: a chart needs finite numbers" loss "$out/nan.jsonl" \
  --out "$out/x.svg"
printf '{"step":1,"loss":"nan"}\n' > "$out/text.jsonl"
expect2 "line 1: step 1, loss 'nan': a chart needs finite numbers" loss "$out/text.jsonl" \
  --out "$out/x.svg"
expect2 "is not the --json_out of tools/bench_vs_pytorch.py" speed "$mem" --out "$out/x.svg"
expect2 "1 labels for 2 files" loss "$ddp" "$fsdp" --labels one --out "$out/x.svg"
expect2 "cannot write '$out/no/such/dir.svg'" loss "$ddp" --out "$out/no/such/dir.svg"
expect2 "required" memory "$mem"
[[ ! -e "$out/x.svg" ]] || fail "nothing written on errors"
echo "errors: exit 2, naming the file"
echo PASS
