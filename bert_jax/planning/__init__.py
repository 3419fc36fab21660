"""Accelerator planning: what a config's train step needs and how fast it can
run on TPU slices and GPU nodes that are not here, from this CPU
(`launch/compile.py`, and the bounds `launch/benchmark.py` prints).

It sits above `bert_jax.training` (it compiles the trainer's step for other
devices) and the train loop never imports it (MaxText keeps `train_compile`
apart the same way).

  aot          ahead-of-time compilation for a target: memory per device,
               the largest batch that fits, projected hours
  topologies   TPU slices and GPU nodes by name (`v5e-256`, `h100-8`), their
               devices and links, over the chip table `bert_jax.training.chips`
  hlo          the reader of a compiled program's HLO text (loops, trip counts,
               collectives)
  hlo_cost     the per-instruction FLOPs and bytes of that parse
  step_bound   the roofline bound on a step's time (compute, memory, links)
"""
