"""toolcall.models.recipe.average: the uniform weight average of same-shaped Hugging Face folders."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from toolcall.models.recipe.average import MismatchError, average_tensors, main, write_average  # noqa: E402

CONFIG = {"model_type": "qwen3", "hidden_size": 4}


def folder(path, tensors, config=CONFIG, tokenizer="{\"tok\": 1}"):
    """A minimal snapshot folder: model.safetensors, config.json and a tokenizer file."""
    path.mkdir()
    safetensors_torch.save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text(tokenizer)
    return path


def test_average_of_two_folders_is_the_elementwise_mean(tmp_path):
    a = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -1.0])}
    b = {"w": torch.tensor([[3.0, 0.0], [-3.0, 8.0]]), "b": torch.tensor([1.5, 1.0])}
    write_average(tmp_path / "out", [folder(tmp_path / "a", a), folder(tmp_path / "b", b, tokenizer="other")])
    out = safetensors_torch.load_file(str(tmp_path / "out" / "model.safetensors"))
    assert sorted(out) == ["b", "w"]
    assert torch.equal(out["w"], torch.tensor([[2.0, 1.0], [0.0, 6.0]]))
    assert torch.equal(out["b"], torch.tensor([1.0, 0.0]))
    # the other files come from the first folder
    assert (tmp_path / "out" / "tokenizer.json").read_text() == "{\"tok\": 1}"
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == CONFIG


def test_bf16_is_averaged_in_float32_and_stored_as_bf16(tmp_path):
    gen = torch.Generator().manual_seed(0)
    values = [torch.randn(1000, generator=gen).to(torch.bfloat16) for _ in range(4)]
    folders = [folder(tmp_path / f"s{i}", {"w": v}) for i, v in enumerate(values)]
    out = average_tensors(folders)["w"]
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, (sum(v.float() for v in values) / 4).to(torch.bfloat16))
    # a bf16 running sum rounds at every step and gives other values: the test can tell them apart
    assert not torch.equal(out, sum(values[1:], values[0]) / 4)


def test_mean_of_one_folder_is_that_folder(tmp_path):
    w = {"w": torch.randn(3, 5, generator=torch.Generator().manual_seed(0))}
    out = average_tensors([folder(tmp_path / "a", w)])
    assert torch.equal(out["w"], w["w"])


@pytest.mark.parametrize("other, message", [
    ({"w": torch.zeros(2, 2), "extra": torch.zeros(1)}, "different tensor names"),
    ({"v": torch.zeros(2, 2)}, "different tensor names"),
    ({"w": torch.zeros(2, 3)}, "w is (2, 3)"),
    ({"w": torch.zeros(2, 2, dtype=torch.bfloat16)}, "torch.bfloat16"),
])
def test_different_names_shapes_or_dtypes_are_refused(tmp_path, other, message):
    a = folder(tmp_path / "a", {"w": torch.zeros(2, 2)})
    b = folder(tmp_path / "b", other)
    with pytest.raises(MismatchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        write_average(tmp_path / "out", [a, b])
    assert not (tmp_path / "out").exists()


def test_different_configs_are_refused(tmp_path):
    a = folder(tmp_path / "a", {"w": torch.zeros(2)})
    b = folder(tmp_path / "b", {"w": torch.zeros(2)}, config={**CONFIG, "hidden_size": 8})
    with pytest.raises(MismatchError, match="config.json differs"):
        average_tensors([a, b])


def test_output_may_not_be_an_input(tmp_path):
    a = folder(tmp_path / "a", {"w": torch.ones(2)})
    with pytest.raises(MismatchError, match="is one of the inputs"):
        write_average(a, [a])
    assert torch.equal(safetensors_torch.load_file(str(a / "model.safetensors"))["w"], torch.ones(2))


def test_command_line_writes_the_average_and_exits_with_the_reason(tmp_path, capsys):
    a = folder(tmp_path / "a", {"w": torch.tensor([1.0])})
    b = folder(tmp_path / "b", {"w": torch.tensor([2.0])})
    main([str(tmp_path / "out"), str(a), str(b)])
    assert "mean of 2 folders" in capsys.readouterr().out
    assert torch.equal(safetensors_torch.load_file(str(tmp_path / "out" / "model.safetensors"))["w"],
                       torch.tensor([1.5]))
    c = folder(tmp_path / "c", {"w": torch.tensor([1.0, 2.0])})
    with pytest.raises(SystemExit, match="average: .*w is \\(2,\\)"):
        main([str(tmp_path / "out2"), str(a), str(c)])
