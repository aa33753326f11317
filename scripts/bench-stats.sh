# Helpers the measuring scripts share (sourced): the page cache dropped, a command's peak RSS from
# /usr/bin/time -v, and summaries of numbers read one per line.
cold() {  # drops the page cache; says when it cannot
  sync
  if { echo 3 > /proc/sys/vm/drop_caches; } 2> /dev/null; then echo cold; else echo "warm (drop_caches needs root)"; fi
}
peak_rss() { awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 * 1024}' "$1"; }
stats() {  # numbers on stdin -> "mean ± 95% half-width" (Student t, n - 1 degrees of freedom)
  awk 'BEGIN {split("12.71 4.30 3.18 2.78 2.57 2.45 2.36 2.31 2.26", t, " ")}
       {x[NR] = $1; s += $1} END {if (NR == 0) {print "-"; exit} m = s / NR; v = 0
       for (i = 1; i <= NR; ++i) v += (x[i] - m) ^ 2
       h = NR > 1 ? t[NR - 1] * sqrt(v / (NR - 1) / NR) : 0; printf "%.3f ± %.3f\n", m, h}'
}
mean() { awk '{s += $1} END {if (NR) printf "%.4f", s / NR; else printf "null"}'; }
max() { awk '$1 > m {m = $1} END {printf "%.0f", m}'; }
