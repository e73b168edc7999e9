"""HF <-> orbax conversion: bit-exact round trips, transformers reload, sharded files, clear errors."""
import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file
from transformers import LlamaForCausalLM

import models
from models.checkpoint import CheckpointError, convert_checkpoint_to_hf, convert_hf_to_checkpoint
from models.config import ConfigError
from models.convert import WeightsError, read_hf_params, write_hf
from rljax.cli import main as cli
from tests.conftest import hf_tiny_llama, random_ids


def _tensors(directory):
    out = {}
    for path in sorted(directory.glob("*.safetensors")):
        out.update(load_file(str(path)))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_hf_orbax_hf_round_trip_is_bit_exact(tmp_path, dtype):
    hf_dir, _ = hf_tiny_llama(tmp_path, dtype=dtype)
    assert cli(["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "ckpt")]) == 0
    assert cli(["convert", "--to-hf", str(tmp_path / "ckpt"), "--out", str(tmp_path / "back")]) == 0
    original, back = _tensors(hf_dir), _tensors(tmp_path / "back")
    assert set(back) == set(original)
    for name, tensor in original.items():
        assert back[name].dtype == tensor.dtype, name
        assert back[name].tobytes() == tensor.tobytes(), name


def test_exported_checkpoint_loads_in_transformers_and_matches(tmp_path):
    hf_dir, hf_model = hf_tiny_llama(tmp_path, tie_word_embeddings=True)
    ckpt = convert_hf_to_checkpoint(hf_dir, tmp_path / "ckpt")
    convert_checkpoint_to_hf(ckpt, tmp_path / "back")
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    ids = random_ids(0, (1, 30), 301)
    with torch.no_grad():
        ref = hf_model(torch.tensor(ids)).logits.numpy()
        again = reloaded(torch.tensor(ids)).logits.numpy()
    np.testing.assert_array_equal(ref, again)
    ours, _ = models.load_checkpoint(ckpt)(jnp.asarray(ids))
    assert np.abs(np.asarray(ours) - ref).max() <= 1e-4


def test_many_shards_with_index_are_written_and_read(tmp_path):
    hf_dir, hf_model = hf_tiny_llama(tmp_path)
    cfg, params = read_hf_params(hf_dir)
    written = write_hf(params, cfg, tmp_path / "sharded", max_shard_bytes=20_000)
    assert len(written) > 3
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in written}
    _, again = read_hf_params(tmp_path / "sharded")
    for key in ("embed_vd", "lm_head_dv"):
        np.testing.assert_array_equal(again[key], params[key])
    np.testing.assert_array_equal(again["layers"]["q_dnh"], params["layers"]["q_dnh"])
    reloaded = LlamaForCausalLM.from_pretrained(tmp_path / "sharded").eval()
    ids = torch.tensor(random_ids(2, (1, 9), 301))
    with torch.no_grad():
        np.testing.assert_array_equal(reloaded(ids).logits.numpy(), hf_model(ids).logits.numpy())


def test_transformers5_rope_parameters_and_classic_rope_scaling_both_read():
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    base = dict(model_type="llama", vocab_size=10, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)
    classic = models.LlamaConfig.from_hf_dict(dict(base, rope_theta=500000.0, rope_scaling=scaling))
    new = models.LlamaConfig.from_hf_dict(dict(base, rope_parameters=dict(scaling, rope_theta=500000.0)))
    assert classic == new and classic.rope_theta == 500000.0 and classic.rope_scaling.factor == 8.0


def test_initializer_range_is_read_written_and_sets_the_fresh_weights_std():
    cfg = models.LlamaConfig.from_hf_dict(dict(model_type="llama", vocab_size=64, hidden_size=32,
                                               intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, initializer_range=0.3))
    assert cfg.initializer_range == 0.3 and cfg.to_hf_dict()["initializer_range"] == 0.3
    model = models.Llama(cfg, rngs=nnx.Rngs(0))
    for weight in (model.embed_vd[...], model.layers.q_dnh[...], model.layers.down_fd[...]):
        assert abs(float(np.std(weight)) - 0.3) < 0.03
    assert float(np.std(models.Llama(cfg.replace(initializer_range=0.02), rngs=nnx.Rngs(0)).embed_vd[...])) < 0.03
    with pytest.raises(ConfigError, match="initializer_range must be > 0, got 0.0"):
        cfg.replace(initializer_range=0.0)


@pytest.mark.parametrize("preset,billions", [("llama3_1_8b", 8.03), ("llama3_8b", 8.03), ("llama3_1_70b", 70.55),
                                             ("llama3_3_70b", 70.55), ("smollm2_135m", 0.1345)])
def test_dry_run_parameter_counts_match_known_sizes(capsys, preset, billions):
    assert cli(["convert", "--dry-run", "--preset", preset]) == 0
    report = json.loads(capsys.readouterr().out)
    assert round(report["params"] / 1e9, 4 if billions < 1 else 2) == billions
    if preset == "smollm2_135m":
        assert report["params"] == 134_515_008


# ---- bad input: one clear line each ---------------------------------------------------------------------------

def _error_line(capsys, argv):
    capsys.readouterr()  # drop what fixtures printed (transformers' progress bars)
    assert cli(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_unsupported_model_type_and_architecture(tmp_path, capsys):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps(dict(config, model_type="mistral")))
    assert "unsupported model_type 'mistral'" in _error_line(capsys, ["convert", "--from-hf", str(hf_dir),
                                                                       "--out", str(tmp_path / "x")])
    (hf_dir / "config.json").write_text(json.dumps(dict(config, architectures=["LlamaForSequenceClassification"])))
    with pytest.raises(ConfigError, match="unsupported architectures"):
        read_hf_params(hf_dir)


def test_missing_shard_is_named(tmp_path, capsys):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    cfg, params = read_hf_params(hf_dir)
    out = tmp_path / "sharded"
    written = write_hf(params, cfg, out, max_shard_bytes=20_000)
    written[1].unlink()
    err = _error_line(capsys, ["convert", "--from-hf", str(out), "--out", str(tmp_path / "x")])
    assert f"missing shard {written[1].name}" in err


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path, capsys):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((81, 48), np.float32)
    save_file(tensors, str(hf_dir / "model.safetensors"))
    err = _error_line(capsys, ["convert", "--from-hf", str(hf_dir), "--out", str(tmp_path / "x")])
    assert "model.layers.1.mlp.up_proj.weight" in err and "(81, 48)" in err and "(80, 48)" in err


def test_missing_tensor_is_named(tmp_path):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    del tensors["model.layers.2.self_attn.k_proj.weight"]
    save_file(tensors, str(hf_dir / "model.safetensors"))
    with pytest.raises(WeightsError, match="missing tensor model.layers.2.self_attn.k_proj.weight"):
        read_hf_params(hf_dir)


def test_empty_and_corrupt_checkpoint_directories(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert "not an rljax checkpoint" in _error_line(capsys, ["convert", "--to-hf", str(tmp_path / "empty"),
                                                               "--out", str(tmp_path / "o")])
    hf_dir, _ = hf_tiny_llama(tmp_path)
    ckpt = convert_hf_to_checkpoint(hf_dir, tmp_path / "ckpt")
    for path in (ckpt / "params").rglob("*"):
        if path.is_file() and path.stat().st_size > 1000:
            path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt or incomplete params"):
        models.load_checkpoint(ckpt)
    shutil.rmtree(ckpt / "params")
    with pytest.raises(CheckpointError, match="not an rljax checkpoint"):
        models.load_checkpoint(ckpt)
    with pytest.raises(CheckpointError, match="no such checkpoint directory"):
        models.load_checkpoint(tmp_path / "nowhere")
