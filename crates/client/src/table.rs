//! Plain-text tables for the reports' `Display` impls.

use std::fmt;

/// A table: a header row and data rows; the first column is left-aligned, the rest right-aligned.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Self {
        Self {
            header: header.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row (missing cells print empty).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        self.rows.push(cells.into_iter().map(Into::into).collect());
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut width = vec![0usize; cols];
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in row.iter().enumerate() {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, row: &[String]| -> fmt::Result {
            let mut s = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = row.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    s.push_str("  ");
                }
                if i == 0 {
                    s.push_str(&format!("{c:<w$}"));
                } else {
                    s.push_str(&format!("{c:>w$}"));
                }
            }
            writeln!(f, "{}", s.trim_end())
        };
        line(f, &self.header)?;
        let total = width.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
        writeln!(f, "{}", "-".repeat(total))?;
        for row in &self.rows {
            line(f, row)?;
        }
        Ok(())
    }
}

/// `value` with `digits` decimals, or `-` for NaN.
pub fn num(value: f64, digits: usize) -> String {
    if value.is_nan() {
        "-".into()
    } else {
        format!("{value:.digits$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(["name", "x"]);
        t.row(["a", "1.5"]);
        t.row(["longer", "10.25"]);
        let s = t.to_string();
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines[0], "name        x");
        assert_eq!(lines[2], "a         1.5");
        assert_eq!(lines[3], "longer  10.25");
        assert_eq!(num(f64::NAN, 2), "-");
    }
}
