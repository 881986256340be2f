//! Builds the guest workspaces (`providers/` and `tests/fixtures/guests/`) for `wasm32-wasip2`
//! and writes `$OUT_DIR/wasm_paths.rs`: every produced `.wasm`, by file stem, with its absolute
//! path. Tests get real components without a manual build step.
//!
//! The guests build with the same `cargo` as the host, in their own target directory
//! (`<target>/wasm-guests`), without the host build's flags (`RUSTFLAGS`, clippy's wrapper,
//! coverage instrumentation): those belong to the host and may not even apply to wasm.
//!
//! The Python providers (`providers/python/<name>/app.py`, and those of
//! [`PYTHON_ELSEWHERE`] kept beside their Rust twin, with the helper package
//! `providers/python/vmop_provider/`) are built with componentize-py for world `plugin-http`
//! (`wit/http-guest/`) into `<target>/wasm-guests/python/vmop_provider_<name>_py.wasm`. The
//! tool is `$VMOP_COMPONENTIZE_PY` (set by `scripts/prepare.sh`), else `componentize-py` on
//! `PATH`; without it they are skipped with a warning, and the tests that need them say so.
//! A build takes ~15 CPU-seconds, so it is skipped while a stamp of its inputs (sources, WIT,
//! tool) matches.

use std::collections::hash_map::DefaultHasher;
use std::env;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const TARGET: &str = "wasm32-wasip2";

/// Guest workspaces, relative to the repository root; a missing one is skipped.
const GUEST_WORKSPACES: [&str; 2] = ["providers", "tests/fixtures/guests"];

/// Python providers, relative to the repository root: every subdirectory with an `app.py`
/// except the helper package.
const PYTHON_PROVIDERS: &str = "providers/python";
const PYTHON_HELPER: &str = "vmop_provider";
/// Python providers outside `providers/python/`: (name, directory holding its `app.py`).
const PYTHON_ELSEWHERE: [(&str, &str); 1] = [("testcloud", "providers/testcloud/python")];
/// The WIT world of Python guests (the provider world plus wasi:http).
const PYTHON_WIT: &str = "wit/http-guest";
const PYTHON_WORLD: &str = "plugin-http";
const COMPONENTIZE_PY_ENV: &str = "VMOP_COMPONENTIZE_PY";

/// Variables cargo or the caller set for the host build that must not reach the guest build.
const HOST_ONLY_ENV: [&str; 9] = [
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "CARGO_BUILD_TARGET",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET_DIR",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
    "CLIPPY_ARGS",
];

fn main() {
    if let Err(message) = run() {
        eprintln!("error: {message}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let manifest_dir = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .ok_or("tests/ has no parent directory")?
        .to_path_buf();
    let out_dir = PathBuf::from(env_var("OUT_DIR")?);
    let target_dir = host_target_dir(&out_dir, &root).join("wasm-guests");

    println!("cargo:rerun-if-changed={}", root.join("wit").display());
    // The guests' SDK builds on the contract crate's bounds.
    watch_sources(&root.join("contract"))?;
    for var in ["RUSTUP_TOOLCHAIN", "CARGO", "CI", COMPONENTIZE_PY_ENV] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    check_target_installed()?;

    let mut wasm = Vec::new();
    for workspace in GUEST_WORKSPACES {
        let dir = root.join(workspace);
        let manifest = dir.join("Cargo.toml");
        // Watched even while missing, so the workspace is built as soon as it appears.
        println!("cargo:rerun-if-changed={}", manifest.display());
        if !manifest.is_file() {
            println!("cargo:warning=guest workspace {workspace}/ not found; skipping it");
            continue;
        }
        watch_sources(&dir)?;
        wasm.extend(build_workspace(&manifest, &target_dir)?);
    }
    wasm.extend(build_python_providers(&root, &target_dir.join("python"))?);
    wasm.sort();
    wasm.dedup();
    for pair in wasm.windows(2) {
        if let [(name, first), (other, second)] = pair
            && name == other
        {
            return Err(format!(
                "two guest components are named {name:?} ({} and {}): rename one crate",
                first.display(),
                second.display()
            ));
        }
    }

    let mut table = String::from(
        "/// Every guest component built by `tests/build.rs`: (file stem, absolute path).\n\
         pub static WASM_PATHS: &[(&str, &str)] = &[\n",
    );
    for (name, path) in &wasm {
        table.push_str(&format!(
            "    ({name:?}, {:?}),\n",
            path.display().to_string()
        ));
    }
    table.push_str("];\n");
    fs::write(out_dir.join("wasm_paths.rs"), table)
        .map_err(|e| format!("cannot write {}/wasm_paths.rs: {e}", out_dir.display()))
}

fn env_var(name: &str) -> Result<String, String> {
    env::var(name).map_err(|_| format!("cargo did not set {name}"))
}

/// The host build's target directory: the ancestor of `OUT_DIR` holding cargo's `CACHEDIR.TAG`.
fn host_target_dir(out_dir: &Path, root: &Path) -> PathBuf {
    out_dir
        .ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join("target"))
}

fn check_target_installed() -> Result<(), String> {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    let output = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .map_err(|e| format!("cannot run `{rustc} --print sysroot`: {e}"))?;
    let sysroot = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let lib = Path::new(&sysroot).join("lib/rustlib").join(TARGET);
    if lib.is_dir() {
        Ok(())
    } else {
        Err(format!(
            "the Rust target {TARGET} is not installed (no {}); the provider plugins and test \
             guests are built for it. Install it with:\n\n    rustup target add {TARGET}\n",
            lib.display()
        ))
    }
}

/// `rerun-if-changed` for every file of a workspace except build output. A new source file is
/// noticed through the `mod` line or manifest that must change with it.
fn watch_sources(dir: &Path) -> Result<(), String> {
    // Files only: cargo scans a watched directory recursively, build output included.
    let entries = fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == "target" || name == "__pycache__" || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            watch_sources(&path)?;
        } else {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Ok(())
}

/// Builds one workspace; returns the `.wasm` artifacts cargo reported, by file stem.
fn build_workspace(manifest: &Path, target_dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--release")
        .args(["--target", TARGET])
        .arg("--manifest-path")
        .arg(manifest)
        .arg("--target-dir")
        .arg(target_dir)
        .arg("--message-format=json-render-diagnostics")
        // In CI a guest lockfile that does not match its manifests fails the build, as it does
        // for the host (`cargo test --locked`); locally cargo may update it.
        .args(in_ci().then_some("--locked"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for var in HOST_ONLY_ENV {
        command.env_remove(var);
    }
    for (var, _) in env::vars_os() {
        let var = var.to_string_lossy();
        if var.starts_with("CARGO_PROFILE_") || var.starts_with("CARGO_TARGET_WASM32") {
            command.env_remove(var.as_ref());
        }
    }

    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run `{cargo} build` for {}: {e}", manifest.display()))?;
    let mut wasm = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("cannot read cargo's output: {e}"))?;
            wasm.extend(wasm_artifacts(&line));
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("cannot wait for `{cargo} build`: {e}"))?;
    if !status.success() {
        return Err(format!(
            "building the guests in {} for {TARGET} failed ({status}); see the errors above",
            manifest.display()
        ));
    }
    Ok(wasm)
}

/// Builds each Python provider with componentize-py (see the crate docs); returns them by
/// file stem. Nothing, with a warning, when componentize-py is not installed.
fn build_python_providers(root: &Path, out_dir: &Path) -> Result<Vec<(String, PathBuf)>, String> {
    let providers_dir = root.join(PYTHON_PROVIDERS);
    if !providers_dir.is_dir() {
        return Ok(Vec::new());
    }
    watch_sources(&providers_dir)?;
    let Some(tool) = componentize_py() else {
        println!(
            "cargo:warning=componentize-py not found (set {COMPONENTIZE_PY_ENV} or put it on \
             PATH; `eval \"$(scripts/prepare.sh)\"` installs it): the Python providers in \
             {PYTHON_PROVIDERS}/ are not built, and the tests that need them fail saying so"
        );
        return Ok(Vec::new());
    };
    fs::create_dir_all(out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let mut apps: Vec<(String, PathBuf)> = fs::read_dir(&providers_dir)
        .map_err(|e| format!("cannot read {}: {e}", providers_dir.display()))?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join("app.py").is_file())
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            )
        })
        .filter(|(name, _)| name != PYTHON_HELPER)
        .collect();
    apps.extend(
        PYTHON_ELSEWHERE
            .iter()
            .map(|(name, dir)| ((*name).to_owned(), root.join(dir)))
            .filter(|(_, dir)| dir.join("app.py").is_file()),
    );
    apps.sort();
    let mut built = Vec::new();
    for (name, app_dir) in apps {
        let stem = format!("vmop_provider_{name}_py");
        let output = out_dir.join(format!("{stem}.wasm"));
        let sources = [
            app_dir.clone(),
            providers_dir.join(PYTHON_HELPER),
            root.join(PYTHON_WIT),
            root.join("wit/provider.wit"),
        ];
        let stamp = inputs_stamp(&tool, &sources)?;
        let stamp_file = out_dir.join(format!("{stem}.inputs"));
        if output.is_file() && fs::read_to_string(&stamp_file).ok().as_deref() == Some(&stamp) {
            built.push((stem, output));
            continue;
        }
        let status = Command::new(&tool)
            .arg("-d")
            .arg(root.join(PYTHON_WIT))
            .args(["-w", PYTHON_WORLD, "componentize", "app", "-p"])
            .arg(&app_dir)
            .arg("-p")
            .arg(&providers_dir)
            .arg("-o")
            .arg(&output)
            .current_dir(out_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
        if !status.success() {
            return Err(format!(
                "componentize-py failed to build {} ({status}); see the errors above",
                app_dir.display()
            ));
        }
        fs::write(&stamp_file, &stamp)
            .map_err(|e| format!("cannot write {}: {e}", stamp_file.display()))?;
        built.push((stem, output));
    }
    Ok(built)
}

/// `$VMOP_COMPONENTIZE_PY`, else `componentize-py` found on `PATH`.
fn componentize_py() -> Option<PathBuf> {
    if let Some(path) = env::var_os(COMPONENTIZE_PY_ENV).map(PathBuf::from) {
        return path.is_file().then_some(path);
    }
    env::split_paths(&env::var_os("PATH")?)
        .map(|dir| dir.join("componentize-py"))
        .find(|path| path.is_file())
}

/// A digest of the tool's path and size and of every file under `sources` (path and content),
/// in a stable order: equal stamps mean an identical build.
fn inputs_stamp(tool: &Path, sources: &[PathBuf]) -> Result<String, String> {
    let mut files = Vec::new();
    for source in sources {
        collect_files(source, &mut files)?;
    }
    files.sort();
    let mut hasher = DefaultHasher::new();
    tool.hash(&mut hasher);
    fs::metadata(tool)
        .map(|m| m.len())
        .unwrap_or(0)
        .hash(&mut hasher);
    for file in files {
        file.hash(&mut hasher);
        fs::read(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?
            .hash(&mut hasher);
    }
    Ok(format!("{:016x}\n", hasher.finish()))
}

fn collect_files(path: &Path, files: &mut Vec<PathBuf>) -> Result<(), String> {
    if path.is_file() {
        files.push(path.to_path_buf());
        return Ok(());
    }
    let entries = fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = entry.file_name();
        if name == "__pycache__" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        collect_files(&entry.path(), files)?;
    }
    Ok(())
}

fn in_ci() -> bool {
    env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

/// The `.wasm` files of one `compiler-artifact` message of cargo's JSON output.
fn wasm_artifacts(line: &str) -> Vec<(String, PathBuf)> {
    let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
        return Vec::new();
    };
    if message.get("reason").and_then(|r| r.as_str()) != Some("compiler-artifact") {
        return Vec::new();
    }
    let Some(files) = message.get("filenames").and_then(|f| f.as_array()) else {
        return Vec::new();
    };
    files
        .iter()
        .filter_map(|f| f.as_str())
        .map(PathBuf::from)
        .filter(|path| path.extension().is_some_and(|e| e == "wasm"))
        .filter_map(|path| {
            let stem = path.file_stem()?.to_string_lossy().into_owned();
            Some((stem, path))
        })
        .collect()
}
