"""The planner's per-rank parameters add up to the preset's parameter count (model/param_count.py,
itself checked against a real model's named_parameters) for every TP x PP the presets allow."""
import pytest

from megatron_biglm.model.param_count import count_params
from megatron_biglm.model.presets import load_preset
from megatron_biglm.planner.static_memory import stage_params
from megatron_biglm.planner.workload import Workload


def _workload(mc):
    return Workload(model=mc, seq_length=2048, precision="bf16", attention_backend="varlen", predicted_fraction=0.35,
                    predicted_fraction_peak=0.82, pair_fraction=0.78, overlap_grad_reduce=True, train_steps=1,
                    loss_chunk=2048)


@pytest.mark.parametrize("preset", ["136m", "360m", "1p3b", "3p5b"])
def test_stage_params_sum_to_the_preset(preset):
    mc = load_preset(preset)
    w = _workload(mc)
    for tp in (1, 2, 4):
        if mc.num_attention_heads % tp or mc.query_groups % tp:
            continue
        for pp in (1, 2, 3, 5):
            if mc.num_layers % pp:
                continue
            per_rank = [sum(p.numel for p in stage_params(w, tp, pp, s)) for s in range(pp)]
            norms = (2 * mc.num_layers + 1) * mc.hidden_size  # replicated over TP, not sharded
            tied_copy = mc.padded_vocab_size * mc.hidden_size // tp if pp > 1 else 0  # the last stage's output layer
            assert tp * sum(per_rank) - (tp - 1) * norms - tp * tied_copy == count_params(mc), (tp, pp)
    assert count_params(load_preset("3p5b")) == 3_507_970_560
