import pytest

from hypic.pic.modes import MODES, PICConfig, get_mode, seam_tokens, validate_seam


def test_mode_table():
    assert set(MODES) == {"full_recompute", "prefix_cache", "addition", "transition",
                          "transition_rope", "hypic"}
    add, tr, trr, hy = (get_mode(n) for n in ("addition", "transition", "transition_rope", "hypic"))
    assert (add.use_transition, tr.use_transition, trr.use_transition, hy.use_transition) == (
        False, True, True, True)
    assert (add.rerotate_keys, tr.rerotate_keys, trr.rerotate_keys, hy.rerotate_keys) == (
        False, False, True, True)
    assert add.fixed_seam == tr.fixed_seam == trr.fixed_seam == 0 and hy.fixed_seam is None
    assert get_mode("prefix_cache").uses_prefix_checkpoints
    assert not get_mode("full_recompute").uses_segment_store
    assert get_mode("transition_rope_recompute") is hy


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError, match="unknown mode 'fast'.*full_recompute.*hypic"):
        get_mode("fast")
    with pytest.raises(ValueError, match="unknown mode"):
        PICConfig(mode="fast")


@pytest.mark.parametrize(
    "seam, length, expected",
    [(8, 20, 8), (8, 5, 5), (0, 5, 0), (0.25, 7, 2), (0.25, 8, 2), (0.3, 10, 3), (1.0, 9, 9),
     (0.01, 5, 1), (3, 0, 0)],
)
def test_seam_tokens(seam, length, expected):
    assert seam_tokens(seam, length) == expected


@pytest.mark.parametrize("bad", [-1, 0.0, 1.5, float("nan"), True, "8", None])
def test_bad_seam(bad):
    with pytest.raises(ValueError, match="seam"):
        validate_seam(bad)


def test_resolve_per_request_overrides():
    cfg = PICConfig()  # hypic, w = 8, standalone, segments of 32 tokens and more cached
    p = cfg.resolve()
    assert (p.mode.name, p.seam, p.cold_policy, p.segment_min_tokens) == ("hypic", 8, "standalone", 32)
    assert [p.live_tokens(n) for n in (5, 31, 32, 100)] == [5, 31, 8, 8]  # shorter: all live
    assert PICConfig(segment_min_tokens=0).resolve().live_tokens(5) == 5  # the seam covers it
    with pytest.raises(ValueError, match="segment_min_tokens"):
        PICConfig(segment_min_tokens=-1)
    p = cfg.resolve(mode="transition", cold_policy="standalone")
    assert (p.mode.name, p.seam, p.cold_policy) == ("transition", 0, "standalone")
    assert cfg.resolve(seam=0.5).seam_tokens(10) == 5
    with pytest.raises(ValueError, match="fixed seam"):
        cfg.resolve(mode="addition", seam=4)
    assert cfg.resolve(mode="addition", seam=0).seam == 0
    with pytest.raises(ValueError, match="cold policy"):
        cfg.resolve(cold_policy="lukewarm")
    with pytest.raises(ValueError, match="seam"):
        PICConfig(seam=-2)


@pytest.mark.parametrize(
    "seam, floor, cap, length, expected",
    [(0.1, 8, None, 40, 8), (0.1, 8, None, 200, 20), (0.1, 8, None, 5, 5), (0.1, 8, 16, 400, 16),
     (32, 0, 12, 100, 12), (4, 8, None, 100, 8), (0, 0, None, 50, 0)],
)
def test_seam_floor_and_cap(seam, floor, cap, length, expected):
    assert seam_tokens(seam, length, floor, cap) == expected


def test_seam_floor_applies_to_hypic_only_and_is_validated():
    config = PICConfig(seam=0.05, seam_min_tokens=8, seam_max_tokens=24)
    hypic = config.resolve()
    assert (hypic.live_tokens(40), hypic.live_tokens(300), hypic.live_tokens(1000)) == (8, 15, 24)
    assert config.resolve(mode="addition").live_tokens(300) == 0
    assert config.resolve(seam=4).live_tokens(300) == 8  # a per-request seam keeps the engine's floor
    with pytest.raises(ValueError, match="seam_min_tokens"):
        PICConfig(seam_min_tokens=-1)
    with pytest.raises(ValueError, match="seam_max_tokens"):
        PICConfig(seam_min_tokens=8, seam_max_tokens=4)
