set terminal pngcairo size 900,500 font ",10"
set output "token_latency.png"
set title "klonet8-star: latency of each token (one line per repeat)"
set xlabel "token"
set ylabel "ms"
set key outside right
set grid ytics
set yrange [0:*]
plot for [i=0:2] "token_latency.dat" index i using 1:2 with linespoints pt 7 ps 0.4 title sprintf("repeat %d", i), \
     35.5761 with lines lw 2 dt 2 lc rgb "black" title "median 35.58 ms", \
     36.16272 with lines lw 2 dt 3 lc rgb "red" title "p90 36.16 ms"
set output "devices.png"
set title "klonet8-star: per device (median of repeats)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set xlabel "device"
set ylabel "MiB"
set xtics nomirror
set offsets 0, 0, graph 0.1, 0
unset xrange
plot "devices.dat" using 2:xtic(1) title "peak RSS", "" using 3 title "MemAvailable drop", "" using 4 title "bytes sent"
set output "repeats.png"
set multiplot layout 1,2 title "klonet8-star: per repeat"
set title "time to first token"
set ylabel "ms"
set xlabel "repeat"
unset key
plot "repeats.dat" using 2:xtic(1) lc rgb "#4a7ebb"
set title "decode throughput"
set ylabel "tok/s"
plot "repeats.dat" using 3:xtic(1) lc rgb "#e07b39"
unset multiplot
