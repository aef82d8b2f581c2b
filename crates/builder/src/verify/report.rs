//! The verify report: one row per check, printable as a table or JSON.

use std::fmt;

use serde::Serialize;

use super::MAX_LISTED;

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    /// Everything checked agreed.
    Pass,
    /// At least one difference.
    Fail,
    /// Nothing to check.
    Empty,
}

/// One check: how many items it covered and which failed.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is checked.
    pub name: String,
    /// Items checked.
    pub count: usize,
    /// Number of failures.
    pub failed: usize,
    /// The first failures, described.
    pub failures: Vec<String>,
}

impl Check {
    /// An empty check.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            count: 0,
            failed: 0,
            failures: Vec::new(),
        }
    }

    /// Records one failure (only the first few are kept in full).
    pub fn fail(&mut self, what: String) {
        self.failed += 1;
        if self.failures.len() < MAX_LISTED {
            self.failures.push(what);
        }
    }

    /// Pass, fail or empty.
    pub fn status(&self) -> CheckStatus {
        match (self.failed, self.count) {
            (0, 0) => CheckStatus::Empty,
            (0, _) => CheckStatus::Pass,
            _ => CheckStatus::Fail,
        }
    }
}

/// All checks of one `verify`, plus notes on what could not be checked.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// The checks, in order.
    pub checks: Vec<Check>,
    /// What could not be checked, and why.
    pub notes: Vec<String>,
}

impl VerifyReport {
    /// Whether no check failed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.failed == 0)
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(5);
        writeln!(
            f,
            "{:<width$}  {:>8}  {:>7}  status",
            "check", "checked", "failed"
        )?;
        writeln!(f, "{}", "-".repeat(width + 28))?;
        for c in &self.checks {
            let status = match c.status() {
                CheckStatus::Pass => "ok",
                CheckStatus::Fail => "FAIL",
                CheckStatus::Empty => "-",
            };
            writeln!(
                f,
                "{:<width$}  {:>8}  {:>7}  {status}",
                c.name, c.count, c.failed
            )?;
        }
        for c in self.checks.iter().filter(|c| c.failed > 0) {
            writeln!(f, "\n{} ({} failed):", c.name, c.failed)?;
            for what in &c.failures {
                writeln!(f, "  {what}")?;
            }
            if c.failed > c.failures.len() {
                writeln!(f, "  ... and {} more", c.failed - c.failures.len())?;
            }
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        write!(
            f,
            "{}",
            if self.passed() {
                "verified: DST was built from SRC"
            } else {
                "NOT verified"
            }
        )
    }
}
