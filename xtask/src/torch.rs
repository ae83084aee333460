//! A cached virtual environment with a real PyTorch for the DataLoader test (tests/tests/
//! datawait.rs), made once at `<target dir>/torch-venv` by `cargo xtask test`.
//!
//! PyPI's Linux torch wheel is the CUDA build; it runs on the CPU with the NVIDIA runtime
//! libraries it links against and no driver. `torch --no-deps` plus only the libraries it loads
//! and the Python packages it imports is ~2.5 GB instead of ~2.8 GB and 29 wheels (the recipe
//! measured on Debian 12, 2 vCPUs, no GPU, 2026-12-04: ~2 min, a ~4 GB venv).

use std::{path::PathBuf, process::Command};

use anyhow::Context as _;

use crate::util::{output, run_cmd};

/// The pinned torch and the NVIDIA libraries it links against, installed `--no-deps`.
const TORCH_NO_DEPS: &[&str] = &[
    "torch==2.15.0",
    "nvidia-cublas==13.4.1.3",
    "nvidia-cuda-runtime==13.2.86",
    "nvidia-cufft==12.2.0.57",
    "nvidia-cufile==1.17.1.22",
    "nvidia-cusparse==12.7.10.12",
    "nvidia-cusparselt-cu13==0.8.1",
    "nvidia-nccl-cu13==2.30.7",
    "nvidia-cudnn-cu13==9.26.0.51",
    "nvidia-cuda-nvrtc==13.2.86",
    "nvidia-nvshmem-cu13==3.7.2",
    "nvidia-cuda-cupti==13.2.86",
    "nvidia-nvjitlink==13.5.37",
];

/// What torch imports on the CPU (sympy: torch.optim imports torch._dynamo).
const TORCH_IMPORTS: &[&str] =
    &["filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec", "numpy"];

/// Training frameworks on top, for the tests' real-framework jobs: mmengine's Runner
/// (tests/py/mmengine_job.py), the framework of the incident that started this project,
/// PyTorch Lightning's Trainer (tests/py/lightning_job.py) and Hugging Face's Trainer
/// (tests/py/hf_trainer_job.py; accelerate is what its Trainer needs for torch). Their own
/// dependencies come with them (opencv-python, matplotlib, rich, yapf; torchmetrics,
/// lightning-utilities; huggingface-hub, tokenizers, safetensors); torch stays as above.
const FRAMEWORKS: &[&str] =
    &["mmengine==0.10.7", "pytorch-lightning==2.6.6", "transformers==5.25.0", "accelerate==1.16.0"];

/// The environment variable through which the tests find the venv's python.
pub const PYTHON_ENV: &str = "GPUSTALL_TEST_TORCH_PYTHON";

/// Written last, with the recipe: a venv without it (or with another recipe) is half made.
const STAMP: &str = ".gpustall-torch-complete";

fn recipe() -> String {
    [TORCH_NO_DEPS, TORCH_IMPORTS, FRAMEWORKS].concat().join("\n") + "\n"
}

/// The venv's python, making the venv first unless its stamp says it is complete.
pub fn ensure_venv() -> anyhow::Result<PathBuf> {
    let venv = crate::util::target_dir().join("torch-venv");
    let python = venv.join("bin/python");
    let stamp = venv.join(STAMP);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == recipe()) {
        return Ok(python);
    }
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .with_context(|| format!("removing the half-made {}", venv.display()))?;
    }
    eprintln!(
        "xtask: installing torch 2.15.0 (CPU use), mmengine 0.10.7, PyTorch Lightning 2.6.6 and transformers 5.25.0 into {} for the real-framework tests: ~2.7 GB, a few minutes, once",
        venv.display()
    );
    let made = make_venv(&venv, &python);
    if made.is_err() {
        // The next run starts over rather than trusting a venv that stopped halfway.
        let _ = std::fs::remove_dir_all(&venv);
    }
    made?;
    std::fs::write(&stamp, recipe()).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
}

fn make_venv(venv: &std::path::Path, python: &std::path::Path) -> anyhow::Result<()> {
    run_cmd(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
    let pip = || {
        let mut c = Command::new(python);
        c.args(["-m", "pip", "install", "-q", "--disable-pip-version-check"]);
        c
    };
    run_cmd(pip().args(["--upgrade", "pip"]))?;
    run_cmd(pip().arg("--no-deps").args(TORCH_NO_DEPS))?;
    run_cmd(pip().args(TORCH_IMPORTS))?;
    run_cmd(pip().args(FRAMEWORKS))?;
    // The import is what the test needs; an install that cannot import is not complete.
    let check = "import torch, torch.utils.data, mmengine.runner, pytorch_lightning, transformers, accelerate; print(torch.__version__)";
    let version = output(Command::new(python).args(["-c", check]))
        .context("torch does not import in the new venv")?;
    anyhow::ensure!(version.starts_with("2.15.0"), "the venv has torch {}", version.trim());
    Ok(())
}
