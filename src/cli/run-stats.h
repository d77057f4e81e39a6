/* cli/run-stats: the per-device figures of `hearth run`, sampled once per forward pass and written as
   JSON with --stats-json (issue "models larger than memory": resident weight bytes over time, disk
   bytes read per token, time blocked on weights per token, memory pressure; per block kind the
   compute and load times of TPI-LLM's Prop. 3-4). One device: from its residency manager; a cluster:
   from hc_head_stats, which asks every worker (one round trip each) and restarts their counters —
   so the run's --timings tables are summed here (run_stats_phase) rather than read again. */
#ifndef HEARTH_CLI_RUN_STATS_H
#define HEARTH_CLI_RUN_STATS_H

#include "cluster/cluster.h"
#include "mem/mem.h"

typedef struct run_stats run_stats;

run_stats *run_stats_create(void);
void       run_stats_free(run_stats *rs);
/* After a forward pass of n tokens: one sample per device, from mm (one device; may be NULL) or from
   the cluster. HR_ENOMEM, or the cluster's error. */
int run_stats_sample(run_stats *rs, hmem *mm, hc_head *tp, int n_tokens, hr_err *err);
/* Marks the end of the prompt (samples after it are generation). */
void run_stats_end_prompt(run_stats *rs);
/* Cluster: the devices' figures summed since the previous call (the --timings table). Returns k. */
int run_stats_phase(run_stats *rs, hc_dev_stats *out, int cap);
/* Writes the JSON document (see `hearth run --help`). */
int run_stats_write(const run_stats *rs, const char *path, double prompt_ms, double gen_ms, hr_err *err);

#endif
