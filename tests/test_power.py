import pytest

from p2pnode.resources import UNKNOWN_GPU_SCORE, gpu_power_score, match_model


@pytest.mark.parametrize(
    "name, score",
    [
        ("NVIDIA H200", 2500),
        ("NVIDIA H100 80GB HBM3", 2000),
        ("NVIDIA A100-SXM4-80GB", 624),
        ("NVIDIA A100 80GB PCIe", 624),
        ("NVIDIA GeForce RTX 5090", 419),
        ("NVIDIA L40", 362),
        ("NVIDIA GeForce RTX 4090", 330),
    ],
)
def test_seed_table(name, score):
    assert gpu_power_score(name) == score


def test_gh200_is_not_h200():
    assert gpu_power_score("NVIDIA GH200 480GB") != gpu_power_score("NVIDIA H200")
    assert match_model("NVIDIA GH200 480GB").tokens == ("gh200",)


@pytest.mark.parametrize(
    "exact, family",
    [
        ("NVIDIA GeForce RTX 3060 Ti", "NVIDIA GeForce RTX 3060"),
        ("NVIDIA L40S", "NVIDIA L40"),
        ("NVIDIA H20", "NVIDIA H200"),
        ("NVIDIA A10G", "NVIDIA A10"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 80GB HBM3"),
    ],
)
def test_exact_model_before_family(exact, family):
    assert match_model(exact) is not match_model(family)
    assert gpu_power_score(exact) != gpu_power_score(family)


def test_unknown_model_scores_above_cpu_only_below_known():
    assert gpu_power_score("Matrox Millennium G200") == UNKNOWN_GPU_SCORE
    assert match_model("Matrox Millennium G200") is None
    assert 0 < UNKNOWN_GPU_SCORE < gpu_power_score("NVIDIA GeForce RTX 3060")
