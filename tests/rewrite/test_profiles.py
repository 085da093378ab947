"""Device profiles: built-ins, calibration round trip, malformed files ignored with a warning."""

from __future__ import annotations

import json

import pytest

from jaxrw.errors import InvalidOptionError
from jaxrw.rewrite import profiles
from jaxrw.rewrite.calibrate import calibrate, main


def test_builtin_profiles_and_unknown_name():
    assert profiles.get_profile("h200").matmul_rate("bfloat16") == pytest.approx(790e12)
    with pytest.raises(InvalidOptionError, match=r"unknown device profile 'a100'; valid: \['cpu', 'h200'\]"):
        profiles.get_profile("a100")


def test_efficiency_grows_with_size():
    p = profiles.H200
    assert p.efficiency(4, 16, 16) < p.efficiency(256, 256, 256) < p.efficiency(4096, 4096, 4096) <= 1.0
    assert p.efficiency(1, 4096, 4096) == p.efficiency(256, 256, 256)  # looked up at equal work


def test_calibrate_saves_a_profile_used_by_default(tmp_path, monkeypatch, capsys):
    import jaxrw.rewrite.calibrate as cal

    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    real = cal.calibrate
    monkeypatch.setattr(cal, "calibrate", lambda quick=False: real(quick=True))  # measured quickly here
    assert main([]) == 0
    saved = tmp_path / "profile-cpu.json"
    assert saved.exists() and "saved" in capsys.readouterr().out
    prof = profiles.default_profile("cpu")
    assert prof.source == str(saved) and prof.bandwidth > 0 and prof.matmul_rate("float32") > 0
    assert prof.gemm_efficiency and all(0 < v <= 1 for v in prof.gemm_efficiency.values())


def test_malformed_profile_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXRW_CACHE_DIR", str(tmp_path))
    (tmp_path / "profile-cpu.json").write_text(json.dumps({"name": "x", "kind": "cpu", "bandwidth": -1}))
    with pytest.warns(UserWarning, match="ignoring malformed profile"):
        prof = profiles.default_profile("cpu")
    assert prof is profiles.CPU


def test_calibrate_quick_measures_positive_rates():
    prof = calibrate(quick=True)
    assert prof.kind == "cpu" and prof.launch_s > 0 and prof.matmul_rate("bfloat16") > 0
    # measured, not the built-in profile's (calibrate copied vector_flops and float16's rate)
    assert prof.vector_flops > 0 and prof.vector_flops != profiles.CPU.vector_flops
    assert prof.matmul_rate("float16") != prof.matmul_rate("bfloat16")


def test_transpose_folded_is_measured_saved_and_loaded(tmp_path):
    import dataclasses

    prof = calibrate(quick=True)
    assert isinstance(prof.transpose_folded, bool)  # x @ W.T within 10% of x @ W, or not
    assert profiles.H200.transpose_folded is False and profiles.CPU.transpose_folded is False
    folded = dataclasses.replace(profiles.H200, transpose_folded=True)
    path = profiles.save_profile(folded, tmp_path / "p.json")
    assert profiles.load_profile(path).transpose_folded is True
    # profiles saved before the field existed load with it off
    data = json.loads(path.read_text())
    del data["transpose_folded"]
    path.write_text(json.dumps(data))
    assert profiles.load_profile(path).transpose_folded is False


def test_lhs_transposed_copied_is_measured_saved_and_loaded_and_defaults_by_kind(tmp_path):
    import dataclasses

    prof = calibrate(quick=True)
    assert isinstance(prof.lhs_transposed_copied, bool)  # Wᵀ @ x over 10% slower than W @ x, or not
    assert profiles.CPU.lhs_transposed_copied is True and profiles.H200.lhs_transposed_copied is False
    for base in (profiles.CPU, profiles.H200):
        flipped = dataclasses.replace(base, lhs_transposed_copied=not base.lhs_transposed_copied)
        path = profiles.save_profile(flipped, tmp_path / f"{base.name}.json")
        assert profiles.load_profile(path).lhs_transposed_copied is flipped.lhs_transposed_copied
        # saved before the field existed: the built-in profile's of that kind
        data = json.loads(path.read_text())
        del data["lhs_transposed_copied"]
        path.write_text(json.dumps(data))
        assert profiles.load_profile(path).lhs_transposed_copied is base.lhs_transposed_copied


def test_fused_share_is_saved_loaded_and_bounded(tmp_path):
    # the profile field gpu_session.sh's A/B sets (bench/HISTORY.md, "A win jaxrw leaves")
    import dataclasses

    path = profiles.save_profile(dataclasses.replace(profiles.H200, fused_share=0.1), tmp_path / "p.json")
    assert profiles.load_profile(path).fused_share == 0.1
    data = json.loads(path.read_text())
    del data["fused_share"]  # saved before the field existed
    path.write_text(json.dumps(data))
    assert profiles.load_profile(path).fused_share == profiles.Profile.fused_share
    path.write_text(json.dumps(data | {"fused_share": 1.5}))
    with pytest.warns(UserWarning, match="ignoring malformed profile"):
        assert profiles.load_profile(path) is None


@pytest.mark.parametrize(
    "change, named",
    [
        ({"gemm_efficiency": {"0": 0.0}}, "gemm_efficiency"),  # a ZeroDivisionError in every dot's price
        ({"gemm_efficiency": {"0": -1.0}}, "gemm_efficiency"),  # a negative FLOP term: dots priced as copies
        ({"gemm_efficiency": {"0": float("nan")}}, "gemm_efficiency"),
        ({"transpose_folded": "false"}, "transpose_folded"),  # bool("false") loaded as True
        ({"concat_chains": 0}, "concat_chains"),
        ({"bandwidth": True}, "bandwidth"),  # float(true): a bandwidth of 1 byte/s
        ({"launch_s": False}, "launch_s"),
        ({"vector_flops": "6e13"}, "vector_flops"),  # a string parsed as a number
        ({"gemm_efficiency": {"0": True}}, "gemm_efficiency"),
    ],
)
def test_a_saved_profile_out_of_range_is_ignored(tmp_path, change, named):
    path = profiles.save_profile(profiles.H200, tmp_path / "p.json")
    path.write_text(json.dumps(json.loads(path.read_text()) | change))
    with pytest.warns(UserWarning, match=f"ignoring malformed profile .*{named}"):
        assert profiles.load_profile(path) is None


@pytest.mark.parametrize(
    "change",
    [{"bandwidth": 0.0}, {"bandwidth": -8e9}, {"vector_flops": float("nan")}, {"gemm_efficiency": {0: 0.0}}],
)
def test_a_profile_object_out_of_range_is_named(change):
    # only its type was checked: a zero bandwidth fell back at the first call, a negative one
    # priced every copy below nothing without a word
    import dataclasses

    import jaxrw

    bad = dataclasses.replace(profiles.CPU, **change)
    with pytest.raises(InvalidOptionError, match=f"profile 'cpu': {next(iter(change))}"):
        jaxrw.optimize(lambda a: a @ a, profile=bad)


def test_the_cache_directory_is_absolute_and_expands_the_home(tmp_path, monkeypatch):
    # '~/x' made a directory named '~' in the working directory; a relative path meant another
    # cache (and profile) in each working directory
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("JAXRW_CACHE_DIR", "~/jx")
    assert profiles.cache_dir() == tmp_path / "jx"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("JAXRW_CACHE_DIR", "rel")
    assert profiles.cache_dir() == tmp_path / "rel"
    monkeypatch.delenv("JAXRW_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")  # not absolute: ignored (the XDG spec)
    assert profiles.cache_dir() == tmp_path / ".cache" / "jaxrw"


def test_a_profile_saved_elsewhere_is_used_by_its_path(tmp_path):
    import jax.numpy as jnp

    import jaxrw

    path = profiles.save_profile(profiles.H200, tmp_path / "mine.json")
    assert profiles.get_profile(str(path)).source == str(path)
    args = [jnp.ones(s) for s in ((64, 64), (64, 64), (64, 2))]
    cost = {
        p: jaxrw.optimize(lambda a, b, v: a @ b @ v, profile=p).report(*args).cost_before
        for p in ("h200", "cpu")
    }
    mine = jaxrw.optimize(lambda a, b, v: a @ b @ v, profile=str(path)).report(*args).cost_before
    assert mine == cost["h200"] != cost["cpu"]
    # a missing file is said to be missing, with no warning that it was "malformed" and ignored
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidOptionError, match="missing.json': no such file"):
            jaxrw.optimize(lambda a: a, profile=str(tmp_path / "missing.json"))
        (tmp_path / "bad.json").write_text('{"name": "x"}')
        with pytest.raises(InvalidOptionError, match="bad.json' could not be loaded: KeyError"):
            jaxrw.optimize(lambda a: a, profile=str(tmp_path / "bad.json"))


def test_complex_and_8_bit_float_gemms_have_their_own_rates():
    h = profiles.H200
    assert h.matmul_rate("complex64") == pytest.approx(h.matmul_rate("float32") / 4)  # 4 real GEMMs
    assert h.matmul_rate("complex128") == pytest.approx(h.matmul_rate("float64") / 4)
    assert h.matmul_rate("float8_e4m3fn") == h.matmul_rate("int8") > h.matmul_rate("bfloat16")
    assert profiles.CPU.matmul_rate("float8_e5m2") == profiles.CPU.matmul_rate("float32")  # no int8 rate


@pytest.mark.parametrize("where", ["file_parent", "directory"])
def test_calibrate_refuses_an_unwritable_output_before_measuring(tmp_path, monkeypatch, capsys, where):
    # it measured first and then raised FileExistsError / IsADirectoryError with a traceback
    import jaxrw.rewrite.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", lambda **k: pytest.fail("measured before checking --output"))
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "p.json" if where == "file_parent" else tmp_path
    with pytest.raises(SystemExit) as info:
        main(["--quick", "--output", str(out)])
    assert info.value.code == 2 and "--output" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--output", ""], ["--output", " "], ["--quick"]])
def test_calibrate_never_makes_an_empty_path_or_a_quick_run_the_default(monkeypatch, capsys, argv):
    # --output "" (an unset $OUT) saved the device kind's default profile, which every later
    # optimize reads; --quick (2x apart between two runs) did too (a new user's try)
    import jaxrw.rewrite.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", lambda **k: pytest.fail("measured"))
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and ("empty" in capsys.readouterr().err or "--quick" in " ".join(argv))


def test_calibrate_marks_the_matmul_rates_it_did_not_measure(tmp_path, monkeypatch, capsys):
    # `matmul float64 0.030 TFLOP/s` was printed like a measurement: the built-in cpu profile's value
    import dataclasses

    import jaxrw.rewrite.calibrate as cal

    rates = {**profiles.CPU.matmul_flops, "float32": 82e9, "bfloat16": 72e9, "float16": 92e9}
    fake = dataclasses.replace(profiles.CPU, name="cpu-calibrated", matmul_flops=rates)
    monkeypatch.setattr(cal, "calibrate", lambda quick=False: fake)
    assert main(["--quick", "--output", str(tmp_path / "p.json")]) == 0
    lines = {
        ln.split()[1]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("matmul")
    }
    for dt in ("float64", "int32"):
        assert "inherited: the built-in cpu profile's, not measured" in lines[dt]
    for dt in cal.MEASURED_DTYPES:
        assert "inherited" not in lines[dt]
