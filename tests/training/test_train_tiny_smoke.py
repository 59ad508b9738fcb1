"""Smoke test of training/train_tiny.py: a tiny model, 3 CPU steps, save, resume, reload."""

import json
import os

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from tests.training._scripts import load_script  # noqa: E402


def test_smoke_train_save_resume_reload(tmp_path):
    train_tiny = load_script("train_tiny")
    out = str(tmp_path / "ckpt")
    first = train_tiny.main(["--smoke", "--out", out, "--quiet"])
    assert first["state"]["step"] == 3
    files = sorted(os.listdir(out))
    assert files == sorted(["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                            "trainer_state.json", "train_log.jsonl", "optimizer_exp_avg.safetensors",
                            "optimizer_exp_avg_sq.safetensors"])
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["model_type"] == "qwen3_5_text"
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    records = [json.loads(line) for line in open(os.path.join(out, "train_log.jsonl"))]
    train_lines = [r for r in records if r["event"] == "train"]
    assert len(train_lines) == 3 and all(r["loss"] > 0 and r["answer_loss"] > 0 for r in train_lines)
    assert any(r["event"] == "eval" and "heldout/two_hop" in r for r in records)

    second = train_tiny.main(["--smoke", "--resume", out, "--out", out, "--max-steps", "4", "--quiet"])
    assert second["state"]["step"] == 4 and second["state"]["calls"] == 2
    assert second["optimizer_restored"]
    third = train_tiny.main(["--smoke", "--resume", out, "--out", str(tmp_path / "lean"), "--max-steps", "5",
                             "--no-optimizer-state", "--quiet"])
    assert third["state"]["step"] == 5 and third["optimizer_restored"]
    assert not os.path.exists(str(tmp_path / "lean" / "optimizer_exp_avg.safetensors"))
    fourth = train_tiny.main(["--smoke", "--resume", str(tmp_path / "lean"), "--out", str(tmp_path / "lean"),
                              "--max-steps", "6", "--quiet"])
    assert fourth["state"]["step"] == 6 and not fourth["optimizer_restored"]

    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    ids = tokenizer("<sep> question : where does bako live ? answer :", return_tensors="pt")["input_ids"]
    assert tokenizer.unk_token_id not in ids[0, :3].tolist()
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], config["vocab_size"]) and torch.isfinite(logits).all()


def test_learning_rate_schedule():
    train_tiny = load_script("train_tiny")
    args = train_tiny.parse_args(["--out", "x", "--lr", "1e-3", "--warmup-steps", "10", "--total-steps", "110",
                                  "--min-lr-ratio", "0.1", "--device", "cpu"])
    assert train_tiny.learning_rate(0, args) == pytest.approx(1e-4)
    assert train_tiny.learning_rate(9, args) == pytest.approx(1e-3)
    assert train_tiny.learning_rate(60, args) == pytest.approx(0.55e-3)
    assert train_tiny.learning_rate(110, args) == pytest.approx(1e-4)
    assert train_tiny.learning_rate(500, args) == pytest.approx(1e-4)


def test_collate_right_pads_and_masks():
    train_tiny = load_script("train_tiny")
    from hypic.data.training import TrainingSample

    batch = train_tiny.collate([TrainingSample((5, 6, 7), (False, False, True), "copy"),
                                TrainingSample((8, 9), (False, True), "copy")], pad_id=0)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert batch["valid"].tolist() == [[True] * 3, [True, True, False]]
    assert batch["answer_mask"].tolist() == [[False, False, True], [False, True, False]]


def test_should_advance_needs_every_task():
    train_tiny = load_script("train_tiny")
    from hypic.data.training import CurriculumStage

    stage = CurriculumStage("s", (("copy", 0.5), ("recall", 0.5)), 1, 2, 36, 36, 0.9, 10, 100)
    args = train_tiny.parse_args(["--out", "x", "--device", "cpu", "--advance-window", "256"])
    good_copy_bad_recall = [("copy", True)] * 200 + [("recall", False)] * 56
    assert not train_tiny.should_advance(stage, 50, good_copy_bad_recall, args)
    assert train_tiny.should_advance(stage, 100, good_copy_bad_recall, args)  # max_steps reached
    all_good = [("copy", True)] * 128 + [("recall", True)] * 127 + [("recall", False)]
    assert train_tiny.should_advance(stage, 50, all_good, args)
    assert not train_tiny.should_advance(stage, 5, all_good, args)  # before min_steps
    assert not train_tiny.should_advance(stage, 50, all_good[:100], args)  # window too short


def test_take_batch_respects_budget_and_keeps_leftover():
    train_tiny = load_script("train_tiny")
    from hypic.data.training import CURRICULUM, TrainingStream

    stream = TrainingStream(CURRICULUM[1], seed=3)
    seen, leftover = [], None
    for _ in range(5):
        batch, new_leftover = train_tiny.take_batch(stream, 600, 8, leftover)
        assert len(batch) == 1 or len(batch) * max(len(s.input_ids) for s in batch) <= 600
        assert len(batch) <= 8
        if leftover is not None:
            assert batch[0] is leftover
        seen.extend(batch)
        leftover = new_leftover
    reference = TrainingStream(CURRICULUM[1], seed=3).take(len(seen))
    assert seen == reference  # every sample used, in stream order
