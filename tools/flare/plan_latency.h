// `flare plan-latency`: times the host planner (plan/plan.h) on decode and prefill batches of
// serving size, single-threaded, and prints a table of median latencies (docs/perf.md).
#pragma once

// argv[0] is the subcommand's name; prints to stdout and returns the exit code.
int run_plan_latency(int argc, char** argv);
