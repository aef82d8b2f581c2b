//! A plain aligned text table, and the number formats the reports use.

use std::fmt;

/// Rows of cells; the first column (and any marked with [`Table::left`]) is left-aligned, the
/// others right-aligned.
pub(crate) struct Table {
    header: Vec<String>,
    left: Vec<usize>,
    rows: Vec<Option<Vec<String>>>,
}

impl Table {
    pub(crate) fn new<S: AsRef<str>>(header: &[S]) -> Self {
        Self {
            header: header.iter().map(|h| h.as_ref().to_string()).collect(),
            left: vec![0],
            rows: Vec::new(),
        }
    }

    /// Left-aligns these columns too (text, not numbers).
    pub(crate) fn left(mut self, columns: &[usize]) -> Self {
        self.left.extend_from_slice(columns);
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Some(cells));
    }

    /// A horizontal rule.
    pub(crate) fn rule(&mut self) {
        self.rows.push(None);
    }

    pub(crate) fn render(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.header.len();
        let mut width: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in self.rows.iter().flatten() {
            for (i, c) in row.iter().enumerate().take(n) {
                width[i] = width[i].max(c.chars().count());
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| -> fmt::Result {
            let mut out = String::new();
            for (i, w) in width.iter().enumerate() {
                let c = cells.get(i).map_or("", String::as_str);
                let pad = w.saturating_sub(c.chars().count());
                if i > 0 {
                    out.push_str("  ");
                }
                if self.left.contains(&i) {
                    out.push_str(c);
                    out.push_str(&" ".repeat(pad));
                } else {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(c);
                }
            }
            writeln!(f, "{}", out.trim_end())
        };
        line(f, &self.header)?;
        let total: usize = width.iter().sum::<usize>() + 2 * n.saturating_sub(1);
        let rule = "-".repeat(total);
        writeln!(f, "{rule}")?;
        for row in &self.rows {
            match row {
                Some(cells) => line(f, cells)?,
                None => writeln!(f, "{rule}")?,
            }
        }
        Ok(())
    }
}

/// `1234567` → `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Decimal bytes with a unit picked by size: `9.906 GB`, `37.749 MB`, `6.144 kB`, `24 B`.
pub(crate) fn bytes(b: f64) -> String {
    let a = b.abs();
    if a >= 1e9 {
        format!("{:.3} GB", b / 1e9)
    } else if a >= 1e6 {
        format!("{:.3} MB", b / 1e6)
    } else if a >= 1e3 {
        format!("{:.3} kB", b / 1e3)
    } else {
        format!("{b:.0} B")
    }
}

/// Context length: `4096` → `4K`, `1048576` → `1M`, else the number.
pub(crate) fn context(c: u64) -> String {
    if c == 0 {
        "weights".into()
    } else if c.is_multiple_of(1 << 20) {
        format!("{}M", c >> 20)
    } else if c.is_multiple_of(1024) {
        format!("{}K", c >> 10)
    } else {
        c.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(117_561_977_600), "117,561,977,600");
        assert_eq!(thousands(12), "12");
        assert_eq!(bytes(9_905_993_936.0), "9.906 GB");
        assert_eq!(bytes(24.0), "24 B");
        assert_eq!(context(4096), "4K");
        assert_eq!(context(1 << 20), "1M");
        assert_eq!(context(1000), "1000");
    }
}
