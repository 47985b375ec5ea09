import sys
def worker(layouts, skip=()):
    import patches
    patches.apply_cpu(force=True, skip=skip)
    import patches_fixtures as fx
    out = {}
    for name, tp, pp, distopt in layouts:
        fx.init_parallel(tp, pp)
        cfg = fx.tiny_config(tp, pp)
        m, opt = fx.build_training(cfg, distopt)
        out[name] = fx.train_steps(m, opt, range(2))
    return out
