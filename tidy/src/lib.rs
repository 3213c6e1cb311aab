//! The repository's own structure checks, run with its tests: the house as `ARCHITECTURE.md`
//! draws it.
//!
//! For each library crate, the imports between its files (every path a file names, followed
//! through re-exports to the file that defines it; a `mod.rs` to the modules it declares) must
//! make no circle, must run only down the layers `ARCHITECTURE.md` lists for the crate (a table
//! between `<!-- layers CRATE -->` and `<!-- end layers -->`, the top layer first, naming every
//! file), and no function outside tests may pass [`MAX_FUNCTION_LINES`] lines.
//!
//! `cargo test -p idem-tidy -- --nocapture` prints each crate's figures: files, floors, arrows
//! that run back up, the longest functions.

mod graph;
mod layers;
mod modules;

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use modules::Crate;

/// The longest a function of library code may be, in lines.
pub const MAX_FUNCTION_LINES: usize = 80;

/// What the checks found in one crate.
#[derive(Debug, Default)]
pub struct CrateReport {
    /// The crate's name.
    pub name: String,
    /// Its source files.
    pub files: usize,
    /// The longest chain of imports, in files.
    pub floors: usize,
    /// Imports between its files.
    pub arrows: usize,
    /// The circles of files that import one another, each as its files' paths.
    pub circles: Vec<Vec<String>>,
    /// Imports that run up the layers: `from -> to (from's layer above to's)`.
    pub upward: Vec<String>,
    /// Files no layer lists, and listed ones that do not exist.
    pub unlisted: Vec<String>,
    /// Functions longer than [`MAX_FUNCTION_LINES`]: `file: name (lines)`.
    pub long_functions: Vec<String>,
    /// Its three longest functions: `file: name (lines)`.
    pub longest: Vec<String>,
}

impl CrateReport {
    /// Whether the crate is as drawn.
    pub fn is_clean(&self) -> bool {
        self.circles.is_empty()
            && self.upward.is_empty()
            && self.unlisted.is_empty()
            && self.long_functions.is_empty()
    }

    /// The figures and the findings, for people.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "{}: {} files, {} floors, {} arrows, {} running back up, {} circles; longest: {}\n",
            self.name,
            self.files,
            self.floors,
            self.arrows,
            self.upward.len(),
            self.circles.len(),
            self.longest.join(", ")
        );
        for circle in &self.circles {
            let _ = writeln!(text, "  circle: {}", circle.join(" -> "));
        }
        for line in self
            .upward
            .iter()
            .chain(&self.unlisted)
            .chain(&self.long_functions)
        {
            let _ = writeln!(text, "  {line}");
        }
        text
    }
}

/// Checks the crate at `dir` (named `name`) of the repository at `repo`: its circles, its
/// layers as the architecture map lists them (when it lists any for it), its functions.
///
/// # Errors
///
/// A file cannot be read or parsed, or the map's table of its layers is malformed.
pub fn check_crate(repo: &Path, dir: &str, name: &str) -> Result<CrateReport, String> {
    let src = repo.join(dir).join("src");
    let root = ["lib.rs", "main.rs"]
        .iter()
        .map(|file| src.join(file))
        .find(|path| path.exists())
        .ok_or_else(|| format!("{dir} has no src/lib.rs or src/main.rs"))?;
    let krate = Crate::read(&root)?;
    let edges = graph::imports(&krate);
    let path_of = |index: usize| krate.files[index].path.clone();
    let mut report = CrateReport {
        name: name.to_owned(),
        files: krate.files.len(),
        floors: graph::floors(&edges),
        arrows: edges.iter().map(BTreeSet::len).sum(),
        circles: graph::circles(&edges)
            .into_iter()
            .map(|circle| circle.into_iter().map(path_of).collect())
            .collect(),
        ..CrateReport::default()
    };
    let map = std::fs::read_to_string(repo.join("ARCHITECTURE.md"))
        .map_err(|e| format!("ARCHITECTURE.md: {e}"))?;
    if let Some(layers) = layers::Layers::of(&map, name)? {
        let paths: Vec<String> = krate.files.iter().map(|f| f.path.clone()).collect();
        report.unlisted = layers.unlisted(&paths);
        for (from, targets) in edges.iter().enumerate() {
            for &to in targets {
                if let Some(why) = layers.upward(&paths[from], &paths[to]) {
                    report
                        .upward
                        .push(format!("{} -> {} ({why})", paths[from], paths[to]));
                }
            }
        }
    }
    let mut functions: Vec<(usize, String)> = (krate.files.iter())
        .flat_map(|file| {
            (file.functions.iter())
                .map(move |(name, lines)| (*lines, format!("{}: {name} ({lines})", file.path)))
        })
        .collect();
    functions.sort_by_key(|(lines, _)| std::cmp::Reverse(*lines));
    report.longest = functions.iter().take(3).map(|(_, f)| f.clone()).collect();
    report.long_functions = (functions.into_iter())
        .filter(|(lines, _)| *lines > MAX_FUNCTION_LINES)
        .map(|(_, function)| format!("longer than {MAX_FUNCTION_LINES} lines: {function}"))
        .collect();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library crates, by folder and name.
    const CRATES: [(&str, &str); 9] = [
        ("idem-model", "idem-model"),
        ("idem-sim", "idem-sim"),
        ("idem", "idem"),
        ("idem-runtime", "idem-runtime"),
        ("idem-macros", "idem-macros"),
        ("idem-rabbitmq", "idem-rabbitmq"),
        ("idem-http", "idem-http"),
        ("idem-cli", "idem-cli"),
        ("idem-testkit", "idem-testkit"),
    ];

    /// What is not yet as drawn, and is being rebuilt: each line a finding of
    /// [`CrateReport::describe`], which must not be found elsewhere. It only shrinks.
    const NOT_YET: &[&str] = &[];

    #[test]
    fn the_house_is_as_drawn() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the repository");
        let mut found = Vec::new();
        for (dir, name) in CRATES {
            if !repo.join(dir).exists() {
                continue;
            }
            let report = check_crate(repo, dir, name).expect("the crate reads");
            print!("{}", report.describe());
            let lines = report.describe();
            found.extend(lines.lines().skip(1).map(|line| line.trim().to_owned()));
        }
        let new: Vec<&String> = (found.iter())
            .filter(|line| !NOT_YET.contains(&line.as_str()))
            .collect();
        assert!(new.is_empty(), "not as drawn: {new:#?}");
    }

    #[test]
    fn a_planted_circle_between_files_fails_the_check() {
        let repo = std::env::temp_dir().join(format!("idem-tidy-{}", std::process::id()));
        let src = repo.join("demo").join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
        std::fs::write(src.join("a.rs"), "pub(crate) struct A;\nuse crate::b::B;\n").unwrap();
        std::fs::write(src.join("b.rs"), "pub(crate) struct B(crate::a::A);\n").unwrap();
        std::fs::write(repo.join("ARCHITECTURE.md"), "no layers\n").unwrap();
        let report = check_crate(&repo, "demo", "demo").unwrap();
        std::fs::remove_dir_all(&repo).unwrap();
        assert_eq!(
            report.circles,
            vec![vec!["a.rs".to_owned(), "b.rs".to_owned()]]
        );
        assert!(!report.is_clean());
    }
}
