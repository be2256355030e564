"""What taogpud says about itself: the per-job trace, the journal and the log, metrics, and NVML
(what the GPU itself reports, the evidence behind every proof)."""
