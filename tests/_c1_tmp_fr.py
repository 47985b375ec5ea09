def worker(ckpt_dir, sharding, save_tp=1, load_tp=1):
    import traceback, torch
    import patches, patches_fixtures as fx
    import torch.distributed as dist
    from megatron.core import dist_checkpointing
    patches.apply_cpu(force=True)
    meta = {"distrib_optim_sharding_type": sharding}
    fx.init_parallel(1, 1)
    m, o = fx.build_training(fx.tiny_config(), True)
    base = fx.train_steps(m, o, range(4))
    out = {"base": base}
    try:
        fx.init_parallel(save_tp, 1)
        m, o = fx.build_training(fx.tiny_config(save_tp), True)
        patches.apply_distopt_checkpoint_fixes(o)
        fx.train_steps(m, o, range(2))
        sd = {"model": m.module.sharded_state_dict()}
        sd["optimizer"] = o.sharded_state_dict(sd["model"], metadata=meta)
        dist_checkpointing.save(sd, ckpt_dir)
        fx.init_parallel(load_tp, 1)
        m, o = fx.build_training(fx.tiny_config(load_tp), True)
        patches.apply_distopt_checkpoint_fixes(o)
        sd = {"model": m.module.sharded_state_dict()}
        sd["optimizer"] = o.sharded_state_dict(sd["model"], is_loading=True, metadata=meta)
        loaded = dist_checkpointing.load(sd, ckpt_dir)
        m.module.load_state_dict(loaded["model"]); o.load_state_dict(loaded["optimizer"])
        out["second"] = fx.train_steps(m, o, range(2, 4))
    except Exception:
        out["err"] = traceback.format_exc()[-1200:]
    return out
