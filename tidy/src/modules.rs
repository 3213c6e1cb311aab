//! A crate's modules as its files declare them: which file holds each module (inline ones
//! included), what each defines and imports, and every path its code names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// A module path from the crate's root (`["inbox", "batch"]`).
pub(crate) type ModPath = Vec<String>;

/// One module: the file that holds it, and its names.
#[derive(Debug, Default)]
pub(crate) struct Module {
    /// The file holding it (an index into [`Crate::files`]).
    pub(crate) file: usize,
    /// The items it defines (types, functions, constants, macros, inline modules).
    pub(crate) defines: BTreeSet<String>,
    /// The names it imports, each with the path it names (from the crate's root; `None` for a
    /// path outside the crate).
    pub(crate) imports: BTreeMap<String, Option<ModPath>>,
}

/// One source file of the crate.
#[derive(Debug)]
pub(crate) struct File {
    /// Its path, relative to the crate's `src`.
    pub(crate) path: String,
    /// The paths its code names that may lead into the crate, each from the crate's root.
    pub(crate) named: Vec<ModPath>,
    /// The modules it declares in files of their own (`mod x;`).
    pub(crate) children: Vec<ModPath>,
    /// Its functions outside tests: name and length in lines.
    pub(crate) functions: Vec<(String, usize)>,
}

/// A crate's files and modules.
#[derive(Debug, Default)]
pub(crate) struct Crate {
    pub(crate) files: Vec<File>,
    pub(crate) modules: BTreeMap<ModPath, Module>,
}

impl Crate {
    /// Reads the crate whose root file is `root` (`src/lib.rs` or `src/main.rs`).
    pub(crate) fn read(root: &Path) -> Result<Self, String> {
        let src = root.parent().ok_or("a root file has a folder")?.to_owned();
        let mut krate = Crate::default();
        krate.read_file(&src, root, Vec::new())?;
        Ok(krate)
    }

    fn read_file(&mut self, src: &Path, path: &Path, module: ModPath) -> Result<(), String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let parsed = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let relative = path.strip_prefix(src).unwrap_or(path);
        let index = self.files.len();
        self.files.push(File {
            path: relative.to_string_lossy().replace('\\', "/"),
            named: Vec::new(),
            children: Vec::new(),
            functions: Vec::new(),
        });
        let mut reader = Reader {
            krate: self,
            file: index,
            pending: Vec::new(),
        };
        reader.items(&module, &parsed.items);
        let pending = std::mem::take(&mut reader.pending);
        for child in pending {
            let child_file = child_path(src, path, &module, child.last().expect("a name"))?;
            self.read_file(src, &child_file, child)?;
        }
        Ok(())
    }
}

/// The file of the module `child` declared in the file `parent` (holding `module`).
fn child_path(src: &Path, parent: &Path, module: &ModPath, name: &str) -> Result<PathBuf, String> {
    let is_dir_owner = module.is_empty() || parent.file_name().is_some_and(|file| file == "mod.rs");
    let dir = if is_dir_owner {
        parent.parent().expect("a folder").to_owned()
    } else {
        let stem = parent.file_stem().expect("a file name");
        parent.parent().expect("a folder").join(stem)
    };
    for candidate in [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "module {name} of {} has no file under {}",
        parent.display(),
        src.display()
    ))
}

/// Reads the items of one file.
struct Reader<'a> {
    krate: &'a mut Crate,
    file: usize,
    /// Modules in files of their own, read after this one.
    pending: Vec<ModPath>,
}

impl Reader<'_> {
    fn items(&mut self, module: &ModPath, items: &[syn::Item]) {
        self.krate.modules.entry(module.clone()).or_default().file = self.file;
        for item in items {
            if is_test_only(item) {
                continue;
            }
            match item {
                syn::Item::Mod(inner) => {
                    let mut path = module.clone();
                    path.push(inner.ident.to_string());
                    self.define(module, &inner.ident.to_string());
                    match &inner.content {
                        Some((_, items)) => self.items(&path, items),
                        None => {
                            self.krate.files[self.file].children.push(path.clone());
                            self.pending.push(path);
                        }
                    }
                }
                syn::Item::Use(used) => {
                    let mut flat = Vec::new();
                    flatten(&used.tree, Vec::new(), &mut flat);
                    for (name, path) in flat {
                        let target = self.absolute(module, &path);
                        if let Some(target) = &target {
                            self.krate.files[self.file].named.push(target.clone());
                        }
                        if name != "*" {
                            let imports = &mut self.entry(module).imports;
                            imports.insert(name, target);
                        }
                    }
                }
                other => {
                    if let Some(name) = defined(other) {
                        self.define(module, &name);
                    }
                    if let syn::Item::Fn(function) = other {
                        let lines = body_lines(&function.sig, &function.block);
                        let file = &mut self.krate.files[self.file];
                        file.functions.push((function.sig.ident.to_string(), lines));
                    }
                    if let syn::Item::Impl(block) = other {
                        for inner in &block.items {
                            if let syn::ImplItem::Fn(method) = inner {
                                let lines = body_lines(&method.sig, &method.block);
                                let file = &mut self.krate.files[self.file];
                                file.functions.push((method.sig.ident.to_string(), lines));
                            }
                        }
                    }
                    let mut paths = Paths::default();
                    paths.visit_item(other);
                    for path in paths.0 {
                        if let Some(target) = self.absolute(module, &path) {
                            self.krate.files[self.file].named.push(target);
                        }
                    }
                }
            }
        }
    }

    fn entry(&mut self, module: &ModPath) -> &mut Module {
        self.krate.modules.entry(module.clone()).or_default()
    }

    fn define(&mut self, module: &ModPath, name: &str) {
        self.entry(module).defines.insert(name.to_owned());
    }

    /// `path` as named in `module`, from the crate's root; `None` when it leads out of the
    /// crate (another crate, the prelude).
    fn absolute(&self, module: &ModPath, path: &[String]) -> Option<ModPath> {
        let first = path.first()?;
        let mut base = match first.as_str() {
            "crate" => Vec::new(),
            "self" => module.clone(),
            "super" => {
                let mut up = module.clone();
                up.pop()?;
                let mut rest = &path[1..];
                while rest.first().is_some_and(|s| s == "super") {
                    up.pop()?;
                    rest = &rest[1..];
                }
                let mut whole = up;
                whole.extend(rest.iter().cloned());
                return Some(whole);
            }
            // A name of this module: a child module, or one it defines or imports.
            name if self.is_local(module, name) => module.clone(),
            _ => return None,
        };
        let rest = if matches!(first.as_str(), "crate" | "self") {
            &path[1..]
        } else {
            path
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn is_local(&self, module: &ModPath, name: &str) -> bool {
        let mut child = module.clone();
        child.push(name.to_owned());
        self.pending.contains(&child)
            || self.krate.modules.contains_key(&child)
            || self
                .krate
                .modules
                .get(module)
                .is_some_and(|m| m.defines.contains(name))
    }
}

/// The name an item defines, if it defines one a path can name.
fn defined(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Whether `item` exists for tests only (`#[cfg(test)]`).
fn is_test_only(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        _ => return false,
    };
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}

/// A use tree's names and the paths they stand for (`*` for a glob).
fn flatten(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(String, Vec<String>)>) {
    match tree {
        syn::UseTree::Path(path) => {
            let mut next = prefix;
            next.push(path.ident.to_string());
            flatten(&path.tree, next, out);
        }
        syn::UseTree::Name(name) => {
            let mut whole = prefix;
            let ident = name.ident.to_string();
            if ident == "self" {
                let last = whole.last().cloned().unwrap_or_default();
                out.push((last, whole));
            } else {
                whole.push(ident.clone());
                out.push((ident, whole));
            }
        }
        syn::UseTree::Rename(rename) => {
            let mut whole = prefix;
            if rename.ident != "self" {
                whole.push(rename.ident.to_string());
            }
            out.push((rename.rename.to_string(), whole));
        }
        syn::UseTree::Glob(_) => out.push(("*".to_owned(), prefix)),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten(tree, prefix.clone(), out);
            }
        }
    }
}

/// Every path of two or more segments an item's code names (types, expressions, patterns),
/// tests left out.
#[derive(Default)]
struct Paths(Vec<Vec<String>>);

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.segments.len() >= 2 && path.leading_colon.is_none() {
            self.0
                .push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    // `pub(in crate::a)` restricts who sees an item; it imports nothing.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, module: &'ast syn::ItemMod) {
        if !is_test_only(&syn::Item::Mod(module.clone())) {
            syn::visit::visit_item_mod(self, module);
        }
    }
}

/// How many lines a function spans, from `fn` to its closing brace (its docs and attributes
/// left out).
fn body_lines(signature: &syn::Signature, block: &syn::Block) -> usize {
    let start = signature.fn_token.span.start().line;
    let end = block.brace_token.span.close().end().line;
    end.saturating_sub(start) + 1
}
