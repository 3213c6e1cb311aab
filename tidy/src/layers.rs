//! A crate's layers as the architecture map lists them: a table between
//! `<!-- layers CRATE -->` and `<!-- end layers -->`, the top layer first, each row a layer's
//! name and its files (`key.rs`) or folders (`store/`), in backquotes.

/// The layers of one crate, the top one first.
#[derive(Debug)]
pub(crate) struct Layers {
    rows: Vec<(String, Vec<String>)>,
}

impl Layers {
    /// The layers `map` lists for `krate`; `None` when it lists none.
    pub(crate) fn of(map: &str, krate: &str) -> Result<Option<Self>, String> {
        let open = format!("<!-- layers {krate} -->");
        let Some(start) = map.find(&open) else {
            return Ok(None);
        };
        let body = &map[start + open.len()..];
        let end = body
            .find("<!-- end layers -->")
            .ok_or_else(|| format!("the layers of {krate} have no end"))?;
        let rows = body[..end]
            .lines()
            .filter(|line| line.starts_with('|') && !line.starts_with("|---"))
            .skip(1)
            .map(|line| {
                let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
                let name = cells.first().map_or("", |c| c.trim()).to_owned();
                let files = cells.get(1).map(|cell| quoted(cell)).unwrap_or_default();
                (name, files)
            })
            .collect();
        Ok(Some(Self { rows }))
    }

    /// The layer of `file` (its row, from the top), the deepest folder entry that holds it.
    fn layer_of(&self, file: &str) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for (row, (_, entries)) in self.rows.iter().enumerate() {
            for entry in entries {
                let holds = if entry.ends_with('/') {
                    file.starts_with(entry.as_str())
                } else {
                    file == entry
                };
                if holds && best.is_none_or(|(_, len)| entry.len() > len) {
                    best = Some((row, entry.len()));
                }
            }
        }
        best.map(|(row, _)| row)
    }

    /// Files no layer holds, and entries that hold no file.
    pub(crate) fn unlisted(&self, files: &[String]) -> Vec<String> {
        let mut found: Vec<String> = (files.iter())
            .filter(|file| self.layer_of(file).is_none())
            .map(|file| format!("in no layer: {file}"))
            .collect();
        for (_, entries) in &self.rows {
            for entry in entries {
                let holds = |file: &String| {
                    if entry.ends_with('/') {
                        file.starts_with(entry.as_str())
                    } else {
                        file == entry
                    }
                };
                if !files.iter().any(holds) {
                    found.push(format!("listed but not there: {entry}"));
                }
            }
        }
        found
    }

    /// Why an import from `from` to `to` runs up the layers, if it does.
    pub(crate) fn upward(&self, from: &str, to: &str) -> Option<String> {
        let (from_row, to_row) = (self.layer_of(from)?, self.layer_of(to)?);
        (to_row < from_row).then(|| {
            format!(
                "{} imports from {}, above it",
                self.rows[from_row].0, self.rows[to_row].0
            )
        })
    }
}

/// The backquoted names of a table cell.
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAP: &str = "text\n<!-- layers demo -->\n| layer | files |\n|---|---|\n\
                       | top | `a.rs`, `b/` |\n| bottom | `c.rs`, `b/deep.rs` |\n\
                       <!-- end layers -->\n";

    #[test]
    fn imports_run_down_the_listed_layers() {
        let layers = Layers::of(MAP, "demo").unwrap().unwrap();
        assert_eq!(layers.upward("a.rs", "c.rs"), None);
        assert!(layers.upward("c.rs", "a.rs").is_some());
        assert!(
            layers.upward("b/deep.rs", "b/x.rs").is_some(),
            "the deepest entry wins"
        );
        let files = ["a.rs", "b/x.rs", "b/deep.rs", "d.rs"].map(String::from);
        assert_eq!(
            layers.unlisted(&files),
            ["in no layer: d.rs", "listed but not there: c.rs"]
        );
        assert!(Layers::of(MAP, "other").unwrap().is_none());
    }
}
