"""training/train_long.py at the smoke shape on the CPU: a resumed run equals an uninterrupted one bit
for bit, the checkpoint fits what a device call carries, and the exported model serves in hypic."""

import json
import os

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tests.training._scripts import load_script  # noqa: E402


def _tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update({f"{name}:{k}": v for k, v in load_file(os.path.join(folder, name)).items()})
    return out


def test_resumed_run_equals_uninterrupted_run_and_exports_a_served_model(tmp_path):
    train_long = load_script("train_long")
    common = ["--smoke", "--quiet", "--eval-every", "100", "--save-every", "100"]
    straight = train_long.main([*common, "--out", str(tmp_path / "a"), "--max-steps", "5"])
    first = train_long.main([*common, "--out", str(tmp_path / "b"), "--max-steps", "3"])
    assert not first["resumed"] and first["state"]["stage"] == 1  # passed the first stage at step 2
    second = train_long.main([*common, "--out", str(tmp_path / "b"), "--max-steps", "5",
                              "--export", str(tmp_path / "model")])
    train_long.main(["--smoke", "--quiet", "--out", str(tmp_path / "a"), "--export-only", str(tmp_path / "again")])
    with pytest.raises(ValueError, match="holds no checkpoint"):
        train_long.main(["--smoke", "--quiet", "--out", str(tmp_path / "none"), "--export-only", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="another recipe"):  # a smoke checkpoint read as the full recipe
        train_long.main(["--quiet", "--device", "cpu", "--out", str(tmp_path / "a"),
                         "--export-only", str(tmp_path / "x")])
    assert not (tmp_path / "none").exists() and not (tmp_path / "x").exists()
    exported, again = _tensors(tmp_path / "model"), _tensors(tmp_path / "again")  # a's weights are b's
    assert exported.keys() == again.keys() and all(torch.equal(exported[k], again[k]) for k in exported)
    assert second["resumed"] and second["state"]["step"] == straight["state"]["step"] == 5
    a, b = _tensors(tmp_path / "a"), _tensors(tmp_path / "b")
    assert a.keys() == b.keys() and any(k.startswith("optimizer") for k in a)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    state_a, state_b = (json.load(open(tmp_path / d / "trainer_state.json")) for d in ("a", "b"))
    assert state_b.pop("calls") == 2 and state_a.pop("calls") == 1 and state_a == state_b
    assert straight["eval"] == second["eval"]

    from hypic.entrypoints.llm import LLM, SamplingParams

    llm = LLM(str(tmp_path / "model"), device="cpu", seed=0)
    out = llm.generate("<sep> this passage is about kolton . the code of santon is 57 .<<PIC_SEP>>"
                       "<sep> question : what are the codes of santon and kalmouth ? answer :",
                       SamplingParams(temperature=0, max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2
    config = json.load(open(tmp_path / "model" / "config.json"))
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]


def test_the_recipe_fits_a_device_call():
    """The full-size checkpoint: every weight file under the 16 MiB a device call returns, all of it
    (weights, Adafactor state) within what a call carries beside the 18 MB working tree."""
    recipe, checkpoint = load_script("long_recipe"), load_script("long_checkpoint")
    tiny_model, train_tiny = load_script("tiny_model"), load_script("train_tiny")
    train_tiny.hide_fla()
    from hypic.data.long_vocab import extended_vocabulary

    with torch.device("meta"):
        model = transformers.Qwen3_5ForCausalLM(tiny_model.build_config(recipe.LONG_SHAPE, len(extended_vocabulary())))
    shapes = {n: p for n, p in model.named_parameters()}
    params = sum(p.numel() for p in shapes.values())
    assert 8e6 < params < 9.5e6
    assert model.config.layer_types.count("full_attention") == 3 and len(model.config.layer_types) == 12
    sizes = [sum(t.numel() * 4 for t in group.values())
             for group in checkpoint.shard({n: torch.empty(p.shape, device="meta") for n, p in shapes.items()})]
    assert max(sizes) <= 16 * 2 ** 20 and len(sizes) <= 4
    factored = sum(p.shape[0] + p.shape[1] if p.ndim == 2 else p.numel() for p in shapes.values()) * 4
    assert sum(sizes) + factored < 64 * 2 ** 20 - 19e6


def test_batches_are_a_function_of_their_index_for_any_number_of_workers():
    train_long, recipe = load_script("train_long"), load_script("long_recipe")
    stage = recipe.SMOKE_CURRICULUM[1]
    loaders = [torch.utils.data.DataLoader(train_long.StageBatches(7, 1, stage, 3, 2), batch_size=None,
                                           num_workers=workers) for workers in (0, 2)]
    taken = [[next(it)["input_ids"] for _ in range(4)] for it in map(iter, loaders)]
    assert all(torch.equal(x, y) for x, y in zip(*taken))
    from hypic.data.long_vocab import extended_vocabulary

    direct = recipe.stage_batch(7, 1, stage, 4, extended_vocabulary(), 2)
    assert taken[0][1][0, :len(direct[0].input_ids)].tolist() == list(direct[0].input_ids)
