//! The output bounds are written down three times besides `vmop_contract::bounds` (the table the
//! host checks answers against and the Rust SDK re-exports): in the "# Bounds" table of
//! `wit/provider.wit`, which plugin authors read, and in the Python helper package
//! (`providers/python/vmop_provider/bounds.py`). These tests fail when either differs from the
//! constants, so a bound cannot change on one side alone.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use vmop_contract::bounds::{
    MAX_ADDRESS, MAX_ADDRESSES, MAX_CAPABILITIES, MAX_CLUSTER, MAX_CURSOR, MAX_ID, MAX_INFO_FIELD,
    MAX_LOCATION, MAX_MESSAGE, MAX_OWNER, MAX_PAGE_MACHINES, MAX_PARAMETERS, MAX_RETRY_AFTER,
    MAX_RETRY_AFTER_MS,
};

const MS_PER_HOUR: u64 = 3_600_000;

fn repository_file(relative: &str) -> Result<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// `3600000` as `3,600,000`, the WIT's spelling of large numbers.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// The rows of the "# Bounds" table, (what, bound), in order, without header and rule.
fn wit_table(wit: &str) -> Result<Vec<(String, String)>, String> {
    let (_, section) = wit
        .split_once("/// # Bounds")
        .ok_or("wit/provider.wit has no `# Bounds` section")?;
    section
        .lines()
        .map(str::trim)
        .skip_while(|line| !line.starts_with("/// |"))
        .take_while(|line| line.starts_with("/// |"))
        .skip(2)
        .map(|line| {
            let cells: Vec<&str> = line
                .trim_start_matches("///")
                .trim()
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            match cells.as_slice() {
                [what, bound] => Ok(((*what).to_owned(), (*bound).to_owned())),
                _ => Err(format!(
                    "a row of the WIT's bounds table is not `| what | bound |`: {line}"
                )),
            }
        })
        .collect()
}

/// The table as the constants say it must read.
fn expected_table() -> Vec<(String, String)> {
    let hours = MAX_RETRY_AFTER_MS / MS_PER_HOUR;
    [
        ("`vm-status.id`", format!("1..={MAX_ID}")),
        (
            "`vm-status.addresses`",
            format!("{MAX_ADDRESSES} entries of ≤{MAX_ADDRESS}"),
        ),
        (
            "`vm-status.message`, error messages",
            format!("≤{MAX_MESSAGE}"),
        ),
        ("`vm-status.owner`", format!("1..={MAX_OWNER}")),
        (
            "`rate-limit.retry-after-ms`",
            format!("≤{} ({hours} h)", grouped(MAX_RETRY_AFTER_MS)),
        ),
        ("`location(..)`", format!("1..={MAX_LOCATION}")),
        ("`plugin-info.name`", format!("1..={MAX_INFO_FIELD}")),
        (
            "`plugin-info` version / wit-version",
            format!("≤{MAX_INFO_FIELD} each"),
        ),
        (
            "`plugin-info.capabilities`",
            format!("{MAX_CAPABILITIES} entries of ≤{MAX_INFO_FIELD}"),
        ),
        (
            "`plugin-info.parameters`",
            format!(
                "{MAX_PARAMETERS} entries: name 1..={MAX_INFO_FIELD}, description ≤{MAX_MESSAGE}"
            ),
        ),
        (
            "`page.machines`",
            format!(
                "{} entries",
                grouped(u64::try_from(MAX_PAGE_MACHINES).unwrap_or(u64::MAX))
            ),
        ),
        ("`page.next`", format!("1..={MAX_CURSOR}")),
        ("`listed-machine.cluster`", format!("1..={MAX_CLUSTER}")),
    ]
    .into_iter()
    .map(|(what, bound)| (what.to_owned(), bound))
    .collect()
}

#[test]
fn the_wit_states_the_contracts_bounds() {
    let wit = wit_table(&repository_file("wit/provider.wit").unwrap()).unwrap();
    let expected = expected_table();
    for ((what, bound), (expected_what, expected_bound)) in wit.iter().zip(&expected) {
        assert_eq!(
            (what, bound),
            (expected_what, expected_bound),
            "wit/provider.wit's bounds table differs from vmop_contract::bounds: change both \
             together"
        );
    }
    assert_eq!(
        wit.len(),
        expected.len(),
        "wit/provider.wit's bounds table has {} rows, vmop_contract::bounds states {}: {wit:?}",
        wit.len(),
        expected.len()
    );
}

#[test]
fn the_delay_bound_is_one_number() {
    assert_eq!(
        MAX_RETRY_AFTER.as_millis(),
        u128::from(MAX_RETRY_AFTER_MS),
        "MAX_RETRY_AFTER is MAX_RETRY_AFTER_MS as a Duration"
    );
}

/// `NAME = 123` (underscores allowed) at the start of a line of a Python module.
fn python_constants(source: &str) -> BTreeMap<String, u64> {
    source
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter_map(|(name, value)| {
            let name = name.trim();
            let is_constant = name.starts_with("MAX_")
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
            let value = value.split('#').next().unwrap_or_default().trim();
            let number = value.replace('_', "").parse::<u64>().ok()?;
            is_constant.then(|| (name.to_owned(), number))
        })
        .collect()
}

#[test]
fn the_python_helper_states_the_contracts_bounds() {
    let path = "providers/python/vmop_provider/bounds.py";
    let python = python_constants(&repository_file(path).unwrap());
    let widen = |n: usize| u64::try_from(n).expect("a bound fits u64");
    let expected: BTreeMap<String, u64> = [
        ("MAX_ID", widen(MAX_ID)),
        ("MAX_OWNER", widen(MAX_OWNER)),
        ("MAX_ADDRESSES", widen(MAX_ADDRESSES)),
        ("MAX_ADDRESS", widen(MAX_ADDRESS)),
        ("MAX_MESSAGE", widen(MAX_MESSAGE)),
        ("MAX_RETRY_AFTER_MS", MAX_RETRY_AFTER_MS),
        ("MAX_LOCATION", widen(MAX_LOCATION)),
        ("MAX_INFO_FIELD", widen(MAX_INFO_FIELD)),
        ("MAX_CAPABILITIES", widen(MAX_CAPABILITIES)),
        ("MAX_PARAMETERS", widen(MAX_PARAMETERS)),
        ("MAX_PAGE_MACHINES", widen(MAX_PAGE_MACHINES)),
        ("MAX_CURSOR", widen(MAX_CURSOR)),
        ("MAX_CLUSTER", widen(MAX_CLUSTER)),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect();
    assert_eq!(
        python, expected,
        "{path} differs from vmop_contract::bounds: change both together"
    );
}

#[test]
fn the_parsers_read_what_they_should() {
    assert_eq!(grouped(3_600_000), "3,600,000");
    assert_eq!(grouped(1024), "1,024");
    assert_eq!(grouped(999), "999");
    let table = wit_table(
        "/// # Bounds\n///\n/// | what | bound |\n/// |---|---|\n/// | `a` | 1..=2 |\n\
         /// | `b`, c | ≤3 |\n///\npackage x;\n/// | `later` | 9 |\n",
    )
    .unwrap();
    assert_eq!(
        table,
        [
            ("`a`".to_owned(), "1..=2".to_owned()),
            ("`b`, c".to_owned(), "≤3".to_owned())
        ]
    );
    let python = python_constants("#: doc = 4\nMAX_A = 1_024\nMAX_B = 7  # note\nOTHER = 3\n");
    assert_eq!(
        python,
        [("MAX_A".to_owned(), 1024), ("MAX_B".to_owned(), 7)].into()
    );
}
