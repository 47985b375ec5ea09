"""Capacity planning before a run is submitted (`biglm-plan`): whether a parallel layout fits a
GPU's memory and what the run costs in time. Memory is counted the way megatron-core allocates
it (its gradient-buffer padding, the distributed optimizer's shards) and BiGLM computes (split
attention, the head over predicted rows, the fused loss's chunk). Modules: `gpus` (the GPU
table), `layout`, `workload`, `static_memory`, `activation_memory`, `time_model`, `plan`,
`search`, `report`."""
