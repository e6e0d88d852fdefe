"""envbuild.host: saved nvidia-smi outputs, live probes with a fake runner, JSON contract."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from envbuild.errors import UsageError
from envbuild.host import nvidia_smi, os_facts, probe, report
from envbuild.host.facts import GpuFacts, HostFacts
from envbuild.smoke import rules

FIXTURES = Path(__file__).parent / "fixtures" / "host"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


# --------------------------------------------------------------- saved outputs


@dataclass(frozen=True)
class Saved:
    """What a saved output must yield; None means "not in this format"."""

    file: str
    driver: str | None
    cuda: str | None
    names: tuple[str, ...]
    cc: tuple[str | None, ...]
    memory: tuple[int | None, ...]
    mig: tuple[str | None, ...]
    mig_devices: tuple[int, ...]
    why: str


# One case per block reads better than one value per line.
# fmt: off
SAVED = [
    Saved("rtx4090_table.txt", "550.54.15", "12.4", ("NVIDIA GeForce RTX 4090",), (None,),
          (24564,), (None,), (0,),
          "plain table, 550+ layout; consumer GPU shows MIG M. N/A; processes must not count"),
    Saved("t4_table_470.txt", "470.82.01", "11.4", ("Tesla T4",), (None,), (15109,), (None,),
          (0,), "the narrow pre-535 table layout"),
    Saved("h100x8_table_topo.txt", "535.129.03", "12.2", ("NVIDIA H100 80GB HBM3",) * 8,
          (None,) * 8, (81559,) * 8, ("Disabled",) * 8, (0,) * 8,
          "8 GPUs in the 535 layout followed by `topo -m`"),
    Saved("a100_mig_table.txt", "535.129.03", "12.2", ("NVIDIA A100-SXM4-40GB",), (None,),
          (40960,), ("Enabled",), (3,), "MIG enabled: the table's MIG devices section"),
    Saved("a100_mig_q_and_list.txt", "550.54.15", "12.4", ("NVIDIA A100-SXM4-40GB",), (None,),
          (40960,), ("Enabled",), (3,),
          "`-q` (nested MIG FB totals must not replace the GPU's) plus `-L` MIG lines"),
    Saved("a100x2_mig.xml", "550.54.15", "12.4", ("NVIDIA A100-SXM4-40GB",) * 2, (None, None),
          (40960, 40960), ("Enabled", "Disabled"), (2, 0), "`-q -x` with a DOCTYPE; MIG on GPU 0"),
    Saved("a10g_x4_query.csv", "535.183.01", None, ("NVIDIA A10G",) * 4, ("8.6",) * 4,
          (23028,) * 4, (None,) * 4, (0,) * 4, "the CSV query probe_host runs; [N/A] MIG mode"),
    Saved("h100_query_header_units.csv", "550.54.15", None, ("NVIDIA H100 80GB HBM3",) * 2,
          ("9.0", "9.0"), (81559, 81559), ("Disabled", "Enabled"), (0, 0),
          "CSV with a header and units (`--format=csv`)"),
    # Recorded on an H200 host, driver 580.159.04, 2026-11-28 (scripts/gpu-check.sh; serial zeroed)
    Saved("h200_580_table.txt", "580.159.04", "13.0", ("NVIDIA H200",), (None,), (143771,),
          ("Disabled",), (0,), "recorded: the 580 table"),
    Saved("h200_580_q.txt", "580.159.04", "13.0", ("NVIDIA H200",), (None,), (143771,),
          ("Disabled",), (0,), "recorded: `-q` of driver 580"),
    Saved("h200_580_q.xml", "580.159.04", "13.0", ("NVIDIA H200",), (None,), (143771,),
          ("Disabled",), (0,), "recorded: `-q -x` of driver 580"),
    Saved("h200_580_query.csv", "580.159.04", None, ("NVIDIA H200",), ("9.0",), (143771,),
          ("Disabled",), (0,), "recorded: the CSV query probe_host runs"),
    Saved("h200_580_query_header_units.csv", "580.159.04", None, ("NVIDIA H200",), ("9.0",),
          (143771,), ("Disabled",), (0,), "recorded: the same query with header and units"),
]
# fmt: on


@pytest.mark.parametrize("case", SAVED, ids=[c.file for c in SAVED])
def test_parse_saved_fixture(case: Saved) -> None:
    facts = probe.parse_saved(fixture(case.file))
    assert facts.driver_version == case.driver
    assert facts.driver_source == "file"
    assert facts.cuda_driver_version == case.cuda
    assert tuple(g.name for g in facts.gpus) == case.names
    assert [g.index for g in facts.gpus] == list(range(len(case.names)))
    assert tuple(g.compute_capability for g in facts.gpus) == case.cc
    assert tuple(g.memory_mib for g in facts.gpus) == case.memory
    assert tuple(g.mig_mode for g in facts.gpus) == case.mig
    assert tuple(len(g.mig_devices) for g in facts.gpus) == case.mig_devices
    assert facts.problems == ()


def test_mig_list_lines_carry_profiles_and_uuids() -> None:
    gpu = probe.parse_saved(fixture("a100_mig_q_and_list.txt")).gpus[0]
    assert gpu.uuid == "GPU-3f0b8c1e-6a2d-4e57-9b10-c4d2a7e95f61"
    assert [d.split()[1] for d in gpu.mig_devices] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    assert all("(MIG-" in d for d in gpu.mig_devices)


def test_query_report_alone_lists_mig_instances() -> None:
    text = fixture("a100_mig_q_and_list.txt").split("GPU 0: NVIDIA")[0]
    gpu = probe.parse_saved(text).gpus[0]
    assert gpu.mig_devices == (
        "MIG device 0 (GI 1, CI 0)",
        "MIG device 1 (GI 5, CI 0)",
        "MIG device 2 (GI 13, CI 0)",
    )


def test_h100_topology_has_nvlink_between_every_gpu_pair() -> None:
    topology = probe.parse_saved(fixture("h100x8_table_topo.txt")).topology
    assert topology is not None
    gpus = [f"GPU{i}" for i in range(8)]
    assert list(topology)[:8] == gpus
    for a in gpus:
        assert a not in topology[a]  # the self "X" is left out
        assert {topology[a][b] for b in gpus if b != a} == {"NV18"}
    assert topology["GPU0"]["NIC0"] == "PIX"
    assert topology["GPU0"]["NIC3"] == "SYS"
    assert topology["NIC2"]["GPU5"] == "PIX"
    assert "CPU" not in topology["GPU0"]  # affinity columns are not links


def test_topology_without_tabs_or_escape_codes() -> None:
    text = (
        "        GPU0    GPU1    CPU Affinity    NUMA Affinity\n"
        "GPU0     X      PHB     0-11            N/A\n"
        "GPU1    PHB      X      0-11            N/A\n"
        "\nLegend:\n\n  X    = Self\n"
    )
    assert nvidia_smi.parse_topology(text) == {"GPU0": {"GPU1": "PHB"}, "GPU1": {"GPU0": "PHB"}}


def test_topology_absent() -> None:
    assert nvidia_smi.parse_topology(fixture("rtx4090_table.txt")) is None


@pytest.mark.parametrize(
    ("file", "version"),
    [
        ("proc_version_proprietary.txt", "550.54.15"),
        ("proc_version_open.txt", "570.124.06"),
    ],
)
def test_proc_version_fixtures(file: str, version: str) -> None:
    assert rules.parse_proc_driver_version(fixture(file)) == version
    facts = probe.parse_saved(fixture(file))
    assert (facts.driver_version, facts.driver_source, facts.gpus) == (version, "file", ())


@pytest.mark.parametrize(
    ("banner", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104.05  Sat Aug 19 01:13:15 UTC"
            " 2023",
            "535.104.05",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  560.35.03  Release Build",
            "560.35.03",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  390.157  Wed Oct 12 09:19:07 UTC 2022",
            "390.157",
        ),
        ("GCC version:  gcc version 12.3.0", None),
    ],
)
def test_proc_version_variants(banner: str, version: str | None) -> None:
    assert rules.parse_proc_driver_version(banner) == version


def test_mismatch_is_a_problem_with_a_reboot_hint() -> None:
    facts = probe.parse_saved(fixture("mismatch.txt"))
    assert facts.driver_version is None and facts.gpus == ()
    (problem,) = facts.problems
    assert problem.startswith(
        "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch"
    )
    assert "NVML library version 550.127" in problem
    assert "reboot" in problem
    assert "No working NVIDIA driver" in report.format_human(facts)


def test_mismatch_with_proc_names_the_loaded_kernel_module() -> None:
    facts = probe.parse_saved(fixture("mismatch.txt") + fixture("proc_version_proprietary.txt"))
    assert facts.driver_version == "550.54.15"
    assert len(facts.problems) == 1


def test_driver_not_loaded_is_a_problem() -> None:
    (problem,) = probe.parse_saved(fixture("no_driver.txt")).problems
    assert "couldn't communicate with the NVIDIA driver" in problem
    assert "not loaded" in problem


def test_csv_fills_compute_capability_into_the_table() -> None:
    csv = (
        "0, NVIDIA GeForce RTX 4090, GPU-1a2b3c4d-0000-4000-8000-000000000001, 8.9, 24564,"
        " [N/A], 550.54.15\n"
    )
    facts = probe.parse_saved(fixture("rtx4090_table.txt") + csv)
    (gpu,) = facts.gpus
    assert (gpu.compute_capability, gpu.uuid, gpu.memory_mib) == (
        "8.9",
        "GPU-1a2b3c4d-0000-4000-8000-000000000001",
        24564,
    )
    assert facts.cuda_driver_version == "12.4"


def test_xml_then_topology_in_one_file() -> None:
    topo = "\tGPU0\tGPU1\tCPU Affinity\n GPU0\t X \tNV12\t0-63\nGPU1\tNV12\t X \t0-63\n"
    facts = probe.parse_saved(fixture("a100x2_mig.xml") + topo)
    assert len(facts.gpus) == 2
    assert facts.topology == {"GPU0": {"GPU1": "NV12"}, "GPU1": {"GPU0": "NV12"}}


def test_broken_xml_is_reported_not_raised() -> None:
    facts = probe.parse_saved("<nvidia_smi_log><gpu><product_name>x</gpu></nvidia_smi_log>")
    assert facts.problems and "XML" in facts.problems[0]


@pytest.mark.parametrize("text", ["", "hello world\n", "| just | a | table |\n", "1, 2, 3\n"])
def test_unrecognised_saved_text_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError) as err:
        probe.parse_saved(text)
    assert err.value.exit_code == 2


def test_csv_skips_foreign_lines_and_placeholders() -> None:
    text = (
        'Field "compute_cap" is not a valid field to query.\n'
        "0, Tesla V100-SXM2-16GB, GPU-00000000-0000-4000-8000-00000000000a, 16160,"
        " [Not Supported], 470.82.01\n"
    )
    (gpu,) = nvidia_smi.parse_query_csv(text).gpus
    assert (gpu.name, gpu.compute_capability, gpu.memory_mib, gpu.mig_mode) == (
        "Tesla V100-SXM2-16GB",
        None,
        16160,
        None,
    )


def test_os_release_parsing() -> None:
    text = (
        '# comment\nNAME="Ubuntu"\nVERSION_ID="22.04"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n'
        'ID=ubuntu\nID_LIKE=debian\nBROKEN="unterminated\nlowercase=ignored\n\n'
    )
    assert os_facts.parse_os_release(text) == {
        "NAME": "Ubuntu",
        "VERSION_ID": "22.04",
        "PRETTY_NAME": "Ubuntu 22.04.4 LTS",
        "ID": "ubuntu",
        "ID_LIKE": "debian",
        "BROKEN": "unterminated",
    }


# ------------------------------------------------------------------ live probes

QUERY = (
    "nvidia-smi",
    "--query-gpu=index,name,uuid,compute_cap,memory.total,mig.mode.current,driver_version",
    "--format=csv,noheader,nounits",
)
FALLBACK = (
    "nvidia-smi",
    "--query-gpu=index,name,uuid,memory.total,mig.mode.current,driver_version",
    "--format=csv,noheader,nounits",
)
H100_CSV = "".join(
    f"{i}, NVIDIA H100 80GB HBM3, GPU-00000000-0000-4000-8000-00000000000{i}, 9.0, 81559, "
    "Disabled, 535.129.03\n"
    for i in range(8)
)


@dataclass
class FakeRun:
    """Answers argv tuples from a table; unknown commands are 'not installed' (None)."""

    answers: Mapping[tuple[str, ...], str]
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str]) -> str | None:
        self.calls.append(tuple(argv))
        return self.answers.get(tuple(argv))


def make_root(tmp_path: Path, *, proc: str | None = None, shm: bool = True) -> Path:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "os-release").write_text('NAME="Ubuntu"\nVERSION_ID="22.04"\nID=ubuntu\n')
    if shm:
        (root / "dev" / "shm").mkdir(parents=True)
    if proc is not None:
        (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
        (root / "proc" / "driver" / "nvidia" / "version").write_text(proc)
    return root


def test_no_gpu_host_says_so(tmp_path: Path) -> None:
    run = FakeRun({})
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=None)
    assert (facts.driver_version, facts.driver_source, facts.gpus, facts.problems) == (
        None,
        None,
        (),
        (),
    )
    assert facts.os_release["ID"] == "ubuntu"
    assert isinstance(facts.shm_bytes, int) and facts.shm_bytes > 0
    assert facts.cpu_count is None or facts.cpu_count >= 1
    assert "No NVIDIA GPU/driver found" in report.format_human(facts)
    assert ("nvidia-smi", "topo", "-m") not in run.calls


def test_missing_dev_shm_is_unknown(tmp_path: Path) -> None:
    facts = probe.probe_host({}, run=FakeRun({}), root=make_root(tmp_path, shm=False), nvml=None)
    assert facts.shm_bytes is None


def test_eight_gpus_through_nvidia_smi(tmp_path: Path) -> None:
    saved = fixture("h100x8_table_topo.txt")
    table, topo = saved.split("\t\x1b[4m", 1)
    run = FakeRun(
        {QUERY: H100_CSV, ("nvidia-smi",): table, ("nvidia-smi", "topo", "-m"): "\t\x1b[4m" + topo}
    )
    root = make_root(
        tmp_path, proc=fixture("proc_version_proprietary.txt").replace("550.54.15", "535.129.03")
    )
    facts = probe.probe_host({}, run=run, root=root, nvml=None)
    assert (facts.driver_version, facts.driver_source) == ("535.129.03", "nvidia-smi")
    assert facts.cuda_driver_version == "12.2"  # from the plain table's header
    assert [g.compute_capability for g in facts.gpus] == ["9.0"] * 8
    assert facts.topology is not None and facts.topology["GPU3"]["GPU6"] == "NV18"
    assert facts.problems == ()
    assert ("nvidia-smi", "-L") not in run.calls  # no MIG, no listing
    assert "NV18 ×28" in report.format_human(facts)


def test_old_nvidia_smi_without_compute_cap_falls_back(tmp_path: Path) -> None:
    run = FakeRun(
        {
            QUERY: 'Field "compute_cap" is not a valid field to query.\n',
            FALLBACK: "0, Tesla T4, GPU-00000000-0000-4000-8000-0000000000b1, 15109, [N/A],"
            " 470.82.01\n",
            ("nvidia-smi",): fixture("t4_table_470.txt"),
        }
    )
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=None)
    assert run.calls[:2] == [QUERY, FALLBACK]
    (gpu,) = facts.gpus
    assert (gpu.name, gpu.compute_capability, facts.cuda_driver_version) == (
        "Tesla T4",
        None,
        "11.4",
    )
    assert ("nvidia-smi", "topo", "-m") not in run.calls  # one GPU: no topology probe


def test_mig_enabled_asks_for_the_mig_listing(tmp_path: Path) -> None:
    listing = fixture("a100_mig_q_and_list.txt").split("\nGPU 0: ", 1)[1]
    run = FakeRun(
        {
            QUERY: "0, NVIDIA A100-SXM4-40GB, GPU-3f0b8c1e-6a2d-4e57-9b10-c4d2a7e95f61, 8.0,"
            " 40960, Enabled, 550.54.15\n",
            ("nvidia-smi", "-L"): "GPU 0: " + listing,
        }
    )
    (gpu,) = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=None).gpus
    assert gpu.mig_mode == "Enabled" and len(gpu.mig_devices) == 3
    assert all("MIG-" in d for d in gpu.mig_devices)


def test_live_mismatch_uses_the_kernel_module_version(tmp_path: Path) -> None:
    run = FakeRun({QUERY: fixture("mismatch.txt")})
    root = make_root(tmp_path, proc=fixture("proc_version_proprietary.txt"))
    facts = probe.probe_host({}, run=run, root=root, nvml=None)
    assert (facts.driver_version, facts.driver_source) == ("550.54.15", "proc")
    assert len(facts.problems) == 1 and "version mismatch" in facts.problems[0]
    assert run.calls == [QUERY]  # the table, -L and topo would fail the same way


def test_kernel_and_user_space_versions_disagree(tmp_path: Path) -> None:
    run = FakeRun({QUERY: H100_CSV.splitlines()[0] + "\n"})
    root = make_root(tmp_path, proc=fixture("proc_version_proprietary.txt"))
    facts = probe.probe_host({}, run=run, root=root, nvml=None)
    assert facts.driver_version == "535.129.03"
    assert any("kernel module 550.54.15" in p for p in facts.problems)


@pytest.mark.parametrize(("value", "hidden"), [("", True), ("-1", True), ("0", False)])
def test_cuda_visible_devices_hiding_every_gpu(tmp_path: Path, value: str, hidden: bool) -> None:
    run = FakeRun({QUERY: H100_CSV})
    facts = probe.probe_host(
        {"CUDA_VISIBLE_DEVICES": value}, run=run, root=make_root(tmp_path), nvml=None
    )
    assert any("CUDA_VISIBLE_DEVICES" in p for p in facts.problems) is hidden


# ------------------------------------------------------------------------- NVML


class NvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class Memory:
    total: int


class FakeNvml:
    """The slice of the pynvml API that envbuild.host.nvml uses; GPU 1 is MIG-enabled."""

    NVML_DEVICE_MIG_ENABLE = 1

    def __init__(self, init_error: int | None = None) -> None:
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        return f"gpu{index}"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA A100-SXM4-40GB MIG 3g.20gb" if "mig" in handle else "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetUUID(self, handle: str) -> str:
        return f"MIG-{handle}" if "mig" in handle else f"GPU-{handle}"

    def nvmlDeviceGetCudaComputeCapability(self, handle: str) -> tuple[int, int]:
        return (8, 0)

    def nvmlDeviceGetMemoryInfo(self, handle: str) -> Memory:
        return Memory(total=40960 * 2**20)

    def nvmlDeviceGetMigMode(self, handle: str) -> tuple[int, int]:
        return (1, 1) if handle == "gpu1" else (0, 0)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: str) -> int:
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: str, slot: int) -> str:
        if slot == 1:
            raise NvmlError(6)  # NOT_FOUND: an empty slot
        return f"{handle}-mig{slot}"


def test_nvml_probe(tmp_path: Path) -> None:
    nvml = FakeNvml()
    run = FakeRun(
        {
            ("nvidia-smi", "topo", "-m"): "\tGPU0\tGPU1\tCPU Affinity\n"
            "GPU0\t X \tNV12\t0-31\nGPU1\tNV12\t X \t0-31\n"
        }
    )
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=nvml)
    assert (facts.driver_version, facts.driver_source, facts.cuda_driver_version) == (
        "550.54.15",
        "nvml",
        "12.4",
    )
    assert [(g.compute_capability, g.memory_mib, g.mig_mode) for g in facts.gpus] == [
        ("8.0", 40960, "Disabled"),
        ("8.0", 40960, "Enabled"),
    ]
    assert facts.gpus[1].mig_devices == (
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb device 0 (MIG-gpu1-mig0)",
        "NVIDIA A100-SXM4-40GB MIG 3g.20gb device 2 (MIG-gpu1-mig2)",
    )
    assert nvml.shut_down
    assert run.calls == [("nvidia-smi", "topo", "-m")]  # NVML answered: no CSV query
    assert facts.topology == {"GPU0": {"GPU1": "NV12"}, "GPU1": {"GPU0": "NV12"}}


def test_nvml_library_missing_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    run = FakeRun({QUERY: H100_CSV})
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=FakeNvml(init_error=12))
    assert facts.driver_source == "nvidia-smi" and len(facts.gpus) == 8
    assert facts.problems == ()


@pytest.mark.parametrize(("code", "words"), [(18, "version mismatch"), (9, "not loaded")])
def test_nvml_init_failures_are_problems(tmp_path: Path, code: int, words: str) -> None:
    run = FakeRun({QUERY: H100_CSV})
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path), nvml=FakeNvml(init_error=code))
    assert facts.gpus == () and words in facts.problems[0].lower()
    assert run.calls == []  # nvidia-smi rides on the same broken NVML


# ---------------------------------------------------------------------- runner


def write_tool(directory: Path, body: str) -> None:
    tool = directory / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("echo ok\n", "ok\n"),
        (
            "echo 'Failed to initialize NVML: Driver/library version mismatch'; exit 18\n",
            "Failed to initialize NVML: Driver/library version mismatch\n",
        ),
        ("echo oops >&2; exit 2\n", "oops\n"),
        ("exit 3\n", None),
    ],
)
def test_runner_outputs(tmp_path: Path, body: str, expected: str | None) -> None:
    write_tool(tmp_path, body)
    run = probe.make_runner({"PATH": str(tmp_path)})
    assert run(["nvidia-smi"]) == expected


def test_runner_missing_binary_and_timeout(tmp_path: Path) -> None:
    assert probe.make_runner({"PATH": str(tmp_path)})(["nvidia-smi"]) is None
    write_tool(tmp_path, "exec /bin/sleep 5\n")  # exec: no grandchild holding the pipe
    assert probe.make_runner({"PATH": str(tmp_path)}, timeout=0.3)(["nvidia-smi"]) is None


def test_probe_host_default_runner_uses_env_path(tmp_path: Path) -> None:
    write_tool(tmp_path, f"cat <<'EOF'\n{H100_CSV}EOF\n")
    env = {"PATH": str(tmp_path) + os.pathsep + "/usr/bin:/bin"}
    facts = probe.probe_host(env, root=make_root(tmp_path), nvml=None)
    assert len(facts.gpus) == 8  # every call answers the CSV; the table parse finds nothing


# ------------------------------------------------------------------ JSON, human

TOP_KEYS = [
    "schema_version",
    "driver_version",
    "driver_source",
    "cuda_driver_version",
    "gpus",
    "topology",
    "os_release",
    "cpu_count",
    "shm_bytes",
    "platform",  # issue 38: linux/amd64 or linux/arm64, from the kernel's machine name
    "problems",
    "advice",
]
GPU_KEYS = [
    "index",
    "name",
    "uuid",
    "compute_capability",
    "compute_capability_source",
    "memory_mib",
    "mig_mode",
    "mig_devices",
]


@pytest.mark.parametrize("file", [c.file for c in SAVED] + ["mismatch.txt"])
def test_json_keys_are_stable(file: str) -> None:
    data = report.to_json(probe.parse_saved(fixture(file)))
    assert list(data) == TOP_KEYS
    assert data["schema_version"] == 1
    gpus: Any = data["gpus"]
    assert all(list(g) == GPU_KEYS for g in gpus)
    assert json.loads(json.dumps(data)) == data  # plain JSON types only


def test_json_of_an_empty_host() -> None:
    assert report.to_json(HostFacts()) == {
        "schema_version": 1,
        "driver_version": None,
        "driver_source": None,
        "cuda_driver_version": None,
        "gpus": [],
        "topology": None,
        "os_release": {},
        "cpu_count": None,
        "shm_bytes": None,
        "platform": None,
        "problems": [],
        "advice": [],
    }


def test_human_report_warns_about_small_shm() -> None:
    facts = HostFacts(
        driver_version="550.54.15",
        driver_source="nvml",
        cuda_driver_version="12.4",
        gpus=(GpuFacts(index=0, name="NVIDIA L4", compute_capability="8.9", memory_mib=23034),),
        os_release={"PRETTY_NAME": "Ubuntu 22.04.4 LTS"},
        cpu_count=8,
        shm_bytes=64 * 2**20,
    )
    text = report.format_human(facts)
    assert "550.54.15 (from NVML); supports CUDA up to 12.4" in text
    assert "[0] NVIDIA L4: compute capability 8.9, 23034 MiB" in text
    assert "Ubuntu 22.04.4 LTS" in text
    assert "small" in text and "--shm-size" in text
    assert "No NVIDIA" not in text


@pytest.mark.parametrize("path", [FIXTURES / "h100x8_table_topo.txt",
                                  FIXTURES.parent / "smoke" / "topo-4gpu-pcie-2socket.txt"],
                         ids=lambda p: p.name)
def test_detect_and_the_smoke_test_read_topo_alike(path: Path) -> None:
    from envbuild.smoke.nvsmi import parse_topo

    text = path.read_text(encoding="utf-8")
    matrix = nvidia_smi.parse_topology(text)
    smoke = parse_topo(text)
    assert matrix is not None and smoke.gpus
    for gpu in smoke.gpus:
        gpu_links = {k: v for k, v in matrix[gpu].items() if k.startswith("GPU")}
        assert gpu_links == {k: v for k, v in smoke.links[gpu].items() if k != gpu}


# ------------------------------------------------ section T: the inputs HGX, MIG and PCIe users have

SMOKE_FIXTURES = Path(__file__).parent / "fixtures" / "smoke"


def detect(path: Path, *extra: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from envbuild.commands import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["detect", "--from", str(path), *extra], dict(os.environ))
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", ["topo-2gpu-phb.txt", "topo-4gpu-pcie-2socket.txt", "topo-8gpu-nvlink.txt"])
def test_t4_a_topology_only_file_is_not_a_host_without_gpus(name: str) -> None:
    """docs/faults.md T4: `topo -m` alone names GPUs: no "No NVIDIA GPU ... CPU-only" line above it."""
    code, out, _ = detect(SMOKE_FIXTURES / name)
    gpus = len(nvidia_smi.parse_topology((SMOKE_FIXTURES / name).read_text()) or {})
    assert code == 0 and "No NVIDIA GPU" not in out and "CPU-only" not in out
    assert "Driver      unknown" in out and "in the topology (GPU0, GPU1" in out and "GPU links" in out
    assert gpus >= 2


def test_t5_known_gpus_get_their_compute_capability_from_the_catalogue() -> None:
    """docs/faults.md T5: the table and -q name the GPU but not its cc; the catalogue knows it."""
    code, out, _ = detect(FIXTURES / "t4_table_470.txt")
    assert code == 0 and "Tesla T4: compute capability 7.5 (GPU catalogue)" in out and "cc unknown" not in out
    code, out, _ = detect(FIXTURES / "a100_mig_q_and_list.txt", "--json")
    (gpu,) = json.loads(out)["gpus"]
    assert (gpu["compute_capability"], gpu["compute_capability_source"]) == ("8.0", "catalogue")
    # A reported cc stays the reported one.
    code, out, _ = detect(FIXTURES / "h100_query_header_units.csv", "--json")
    assert {(g["compute_capability"], g["compute_capability_source"]) for g in json.loads(out)["gpus"]} == {
        ("9.0", "reported")}


def test_t5_an_unknown_gpu_stays_cc_unknown(tmp_path: Path) -> None:
    saved = tmp_path / "smi.txt"
    saved.write_text(fixture("rtx4090_table.txt").replace("NVIDIA GeForce RTX 4090", "NVIDIA Quantum GPU 9"))
    code, out, _ = detect(saved)
    assert code == 0 and "NVIDIA Quantum GPU 9: cc unknown" in out


def test_t6_mig_instances_come_with_advice() -> None:
    """docs/faults.md T6: one process sees one MIG device; no P2P between MIG devices."""
    for name in ("a100_mig_q_and_list.txt", "a100_mig_table.txt", "a100x2_mig.xml"):
        code, out, _ = detect(FIXTURES / name)
        assert code == 0 and "Advice:" in out
        assert "a CUDA process sees one MIG device" in out and "mig-user-guide" in out
    assert not any("MIG" in line for line in report.to_json(probe.parse_saved(fixture("rtx4090_table.txt")))[
        "advice"])  # type: ignore[union-attr]


def test_t7_pcie_paths_come_with_advice() -> None:
    """docs/faults.md T7: PIX/PXB (ACS can hang P2P through switches) and PHB/NODE/SYS (through the CPU)."""
    code, out, _ = detect(SMOKE_FIXTURES / "topo-4gpu-pcie-2socket.txt")
    assert code == 0
    assert "PCIe switches (PIX, PXB)" in out and "ACS" in out
    assert "nccl/user-guide/docs/troubleshooting" in out
    assert "only through the CPU (SYS)" in out and "across sockets" in out
    _, out, _ = detect(SMOKE_FIXTURES / "topo-2gpu-phb.txt")
    assert "only through the CPU (PHB)" in out and "ACS" not in out
    _, out, _ = detect(SMOKE_FIXTURES / "topo-8gpu-nvlink.txt")
    assert "Advice:" not in out  # NVLink between every pair: nothing to advise


@pytest.mark.parametrize("name", ["smi-query-2xh100.csv", "smi-query-a100-mig-pending.csv",
                                  "smi-query-rtx4090.csv"])
def test_t8_the_smoke_tests_query_csv_is_accepted(name: str) -> None:
    """docs/faults.md T8: the project's own `--query-gpu` fixtures (the smoke test's health query)."""
    code, out, err = detect(SMOKE_FIXTURES / name, "--json")
    assert code == 0, err
    data = json.loads(out)
    rows = (SMOKE_FIXTURES / name).read_text().strip().splitlines()
    assert [g["name"] for g in data["gpus"]] == [r.split(", ")[1] for r in rows]
    assert [g["uuid"] for g in data["gpus"]] == [r.split(", ")[2] for r in rows]
    assert [g["mig_mode"] for g in data["gpus"]] == [
        {"Enabled": "Enabled", "Disabled": "Disabled"}.get(r.split(", ")[13]) for r in rows]


def test_t5_detect_still_reports_when_the_data_cannot_be_read(tmp_path: Path) -> None:
    """docs/faults.md T5: the catalogue lookup is a bonus; unreadable data leaves the cc unknown, exit 0."""
    import contextlib
    import io
    import shutil

    from envbuild.commands import cli

    data = tmp_path / "matrices"
    shutil.copytree(Path(__file__).resolve().parents[1] / "matrices", data)
    (data / "gpus.yaml").write_text("rows: [\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(["--matrices", str(data), "detect", "--from", str(FIXTURES / "t4_table_470.txt")],
                        dict(os.environ))
    assert code == 0 and "Tesla T4: cc unknown" in out.getvalue()


def test_detect_reports_the_hosts_platform_in_dockers_spelling() -> None:
    """issue 38: uname's machine as Docker names the platform; another machine is None."""
    assert probe.probe_platform("x86_64") == "linux/amd64"
    assert probe.probe_platform("aarch64") == "linux/arm64"
    assert probe.probe_platform("ppc64le") is None
    facts = HostFacts(platform="linux/arm64", os_release={"NAME": "Ubuntu"}, cpu_count=72)
    assert report.to_json(facts)["platform"] == "linux/arm64"
    assert "Platform    linux/arm64" in report.format_human(facts)


# ------------------------------------------------------------ a real H200 host, replayed

H200 = "GPU-6624e7d3-72a9-ceeb-c548-6ae035695233"


def test_recorded_h200_topology_with_terminal_escapes() -> None:
    # driver 580's `topo -m` underlines its header row with ANSI escapes (recorded 2026-11-28)
    text = fixture("h200_580_topo.txt")
    assert "\x1b[4m" in text
    facts = probe.parse_saved(text)
    assert facts.topology == {"GPU0": {}}
    listed = probe.parse_saved(fixture("h200_580_L.txt"))
    assert [(g.name, g.uuid) for g in listed.gpus] == [("NVIDIA H200", H200)]


def test_probe_host_replays_the_recorded_h200(tmp_path: Path) -> None:
    """probe_host over what this H200 host's nvidia-smi printed gives what `envbuild detect
    --json` printed there with NVML hidden (h200_580_detect_smi.json), the GPU and driver
    fields; the OS, CPU and /dev/shm ones come from this test's root."""
    run = FakeRun({QUERY: fixture("h200_580_query.csv"), ("nvidia-smi",): fixture("h200_580_table.txt")})
    facts = probe.probe_host({}, run=run, root=make_root(tmp_path, proc=fixture("h200_580_proc_version.txt")),
                             nvml=None)
    got = report.to_json(facts)
    recorded = json.loads(fixture("h200_580_detect_smi.json"))
    keys = ("driver_version", "driver_source", "cuda_driver_version", "gpus", "topology", "problems")
    assert {k: got[k] for k in keys} == {k: recorded[k] for k in keys}
    assert ("nvidia-smi", "topo", "-m") not in run.calls  # one GPU: no topology asked
    nvml = json.loads(fixture("h200_580_detect_nvml.json"))
    same = [k for k in keys if k != "driver_source"]  # NVML's reading equals nvidia-smi's there
    assert {k: nvml[k] for k in same} == {k: recorded[k] for k in same}
