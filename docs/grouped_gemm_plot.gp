# GF/s against rows per expert for the per-expert OpenBLAS loop, GroupLin and one dense OpenBLAS
# sgemm of the same work (the ceiling), F32, uniform and skewed routing.
#   grouplin bench --plot-data bench.dat
#   gnuplot -e "data='bench.dat'; out='docs/grouped_gemm.png'" docs/grouped_gemm_plot.gp
if (!exists("data")) data = 'bench.dat'
if (!exists("out")) out = 'grouped_gemm.png'
set terminal pngcairo size 1500,1000 font ",11"
set output out
set logscale x 2
set xlabel "rows per expert (T / experts)"
set ylabel "GF/s"
set key top left
set grid
set yrange [0:*]
# Columns: shape rows routing op rows_per_expert dense loop_f32 grouplin_f32 loop_bf16 grouplin_bf16
sel(op, routing) = sprintf("< awk '$4 == \"%s\" && $3 == \"%s\"' %s | sort -g -k5", op, routing, data)
set multiplot layout 2,2 title "Grouped GEMM, F32, 2 threads: every point a (shape, T) case, ratios measured in the same run"
do for [panel in "forward:uniform dgrad:uniform wgrad:uniform forward:skewed"] {
  op = word(system("echo ".panel." | tr ':' ' '"), 1)
  routing = word(system("echo ".panel." | tr ':' ' '"), 2)
  set title op." (".routing." routing)"
  plot sel(op, routing) using 5:6 with points pt 7 ps 1.2 lc rgb "#888888" title "one dense sgemm (ceiling)", \
       sel(op, routing) using 5:7 with points pt 4 ps 1.3 lc rgb "#d62728" title "per-expert OpenBLAS loop", \
       sel(op, routing) using 5:8 with points pt 9 ps 1.5 lc rgb "#1f77b4" title "GroupLin"
}
unset multiplot
