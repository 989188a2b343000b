#!/bin/bash
# Renders `loom plot` of two real runs in a real browser (headless Chromium) and checks what a
# reader sees: the SVG parses, every text lies inside the picture and overlaps no other text,
# the legend names each run distinctly, the accuracy panel has each evaluation of each run, and
# every series is drawn inside its panel. Leaves plot.png (the screenshot) in the work folder.
#
# usage: plot_browser.sh LOOM WORKDIR
# Exit 0 checked, 1 failed, 77 skipped (no Chromium: `apt-get install chromium`).
set -u
loom=$1
work=$2
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "skip: no Chromium on this machine (apt-get install chromium)"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

# Two short real runs, f32 and bf16 autocast, 3 evaluations each.
for amp in off bf16; do
  if ! "$loom" train --amp "$amp" --hidden 64 --epochs 3 --limit 1000 --batch 100 --threads 1 \
       --quiet --metrics "$amp.jsonl" > "train-$amp.log" 2>&1; then
    echo "FAIL: loom train --amp $amp"; cat "train-$amp.log"; exit 1
  fi
done
"$loom" plot off.jsonl bf16.jsonl --label "f32 run" --label "bf16 autocast" -o plot.svg || exit 1

# The page inlines the SVG and measures what the browser laid out.
{
  echo '<!DOCTYPE html><html><head><meta charset="utf-8"></head><body style="margin:0">'
  sed '1{/^<?xml/d}' plot.svg
  cat <<'JS'
<script>
(function () {
  var bad = [];
  var svg = document.querySelector('svg');
  if (!svg) { document.body.setAttribute('data-check', 'FAIL no svg element'); return; }
  var box = svg.getBoundingClientRect();
  var inside = function (r) {
    return r.left >= box.left - 0.5 && r.right <= box.right + 0.5 &&
           r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5;
  };
  var texts = Array.prototype.slice.call(svg.querySelectorAll('text'));
  var rects = texts.map(function (t) { return t.getBoundingClientRect(); });
  texts.forEach(function (t, i) {
    var r = rects[i];
    if (!t.textContent.trim()) bad.push('empty text ' + i);
    if (r.width <= 0 || r.height <= 0) bad.push('text not laid out: ' + t.textContent);
    if (!inside(r)) bad.push('text outside the picture: ' + t.textContent);
  });
  // Two texts overlap when their boxes share more than 1 px in both directions.
  for (var i = 0; i < texts.length; i++)
    for (var j = i + 1; j < texts.length; j++) {
      var a = rects[i], b = rects[j];
      var w = Math.min(a.right, b.right) - Math.max(a.left, b.left);
      var h = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
      if (w > 1 && h > 1)
        bad.push('texts overlap: "' + texts[i].textContent + '" and "' + texts[j].textContent + '"');
    }
  var legend = texts.slice(0, 2).map(function (t) { return t.textContent; });
  if (legend[0].indexOf('f32 run') !== 0 || legend[1].indexOf('bf16 autocast') !== 0)
    bad.push('legend is not the two labels: ' + legend.join(' | '));
  var evals = svg.querySelectorAll('rect.eval');
  if (evals.length !== 6) bad.push('accuracy marks: ' + evals.length + ', expected 2 runs x 3');
  var series = svg.querySelectorAll('polyline');
  if (series.length < 8) bad.push('series drawn: ' + series.length);
  Array.prototype.forEach.call(series, function (p) {
    var r = p.getBoundingClientRect();
    if (!inside(r)) bad.push('a series outside the picture');
  });
  document.body.setAttribute('data-check', bad.length ? 'FAIL ' + bad.join('; ') :
    'OK texts=' + texts.length + ' series=' + series.length + ' evals=' + evals.length);
})();
</script></body></html>
JS
} > check.html

flags="--headless --no-sandbox --disable-gpu --hide-scrollbars"
timeout 120 "$browser" $flags --dump-dom "file://$PWD/check.html" > dom.html 2> browser.log
verdict=$(grep -o 'data-check="[^"]*"' dom.html | head -1)
timeout 120 "$browser" $flags --window-size=960,1200 --screenshot="$PWD/plot.png" \
  "file://$PWD/plot.svg" >> browser.log 2>&1
echo "$browser: $verdict"
case "$verdict" in
  'data-check="OK'*) ;;
  *) echo "FAIL: the browser's check did not pass (dom.html, browser.log in $work)"; exit 1 ;;
esac
if [ ! -s plot.png ] || [ "$(stat -c %s plot.png)" -lt 20000 ]; then
  echo "FAIL: no screenshot (or a blank one) from $browser"; exit 1
fi
echo "checked in $browser; screenshot: $work/plot.png"
