//! Includes resolved on the application's machine for crane-proxy.
//!
//! Natively, `#include` reads a file of the application's machine (or an
//! embedded header given to clCompileProgram). A compiler in crane-proxy
//! would read the proxy domain's files instead — wrong, and a way for one
//! tenant to read what it must not (crane-proxy therefore compiles no source
//! that still has an include: `crane_wire::source`). So before a build or
//! compile on crane-proxy, crane inlines every include it can resolve here —
//! embedded headers by name, then the including file's directory, the
//! build's `-I` directories in order, and the working directory — with
//! `#line` directives so that diagnostics and `__LINE__` keep their lines,
//! and sends the build options without `-I`. An include it cannot resolve
//! becomes an `#error` in its place, which fails the build only where the
//! preprocessor reaches it, as a missing file does natively.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crane_wire::source::{Include, Operand, include_directives, take_include_dirs};

/// Headers may include headers this deep.
const MAX_DEPTH: usize = 64;
/// The most source a program with its headers inlined may come to.
const MAX_OUTPUT: usize = 64 << 20;
/// The name `#line` gives the program's own source after an inlined header.
const MAIN: &str = "<source>";

/// The source to compile on crane-proxy and the options to compile it with.
#[derive(Debug, PartialEq, Eq)]
pub struct Prepared {
    pub source: String,
    pub options: String,
}

/// `source` with its includes inlined and `options` without `-I`.
/// `embedded`: clCompileProgram's header names and sources.
pub fn prepare(source: &str, options: &str, embedded: &[(String, String)]) -> Prepared {
    expand(source, options, embedded).0
}

/// [`prepare`], and how many includes could not be resolved.
fn expand(source: &str, options: &str, embedded: &[(String, String)]) -> (Prepared, usize) {
    let (dirs, options) = take_include_dirs(options);
    let mut x = Expander {
        dirs: dirs.into_iter().map(PathBuf::from).collect(),
        cwd: std::env::current_dir().ok(),
        embedded,
        once: HashSet::new(),
        out: String::with_capacity(source.len()),
        misses: 0,
    };
    x.inline(source, None, MAIN, 0);
    let p = Prepared {
        source: x.out,
        options,
    };
    (p, x.misses)
}

/// Whether every include of `source` (and of what it includes) can be found
/// here with `options` and `embedded` headers: a compile of it can read its
/// files (resume uses this to tell whether a compiled program can be
/// compiled again from its source).
pub fn all_resolvable(source: &str, options: &str, embedded: &[(String, String)]) -> bool {
    if include_directives(source).is_empty() {
        return true;
    }
    expand(source, options, embedded).1 == 0
}

struct Expander<'a> {
    dirs: Vec<PathBuf>,
    cwd: Option<PathBuf>,
    embedded: &'a [(String, String)],
    /// Headers with `#pragma once` already inlined.
    once: HashSet<String>,
    out: String,
    /// Includes that could not be resolved.
    misses: usize,
}

enum Found {
    Text {
        key: String,
        dir: Option<PathBuf>,
        text: String,
    },
    Missing(String),
}

impl Expander<'_> {
    /// Appends `src` (named `name`, in directory `dir`) with its includes inlined.
    fn inline(&mut self, src: &str, dir: Option<&Path>, name: &str, depth: usize) {
        let mut at = 0;
        for inc in include_directives(src) {
            self.out.push_str(&src[at..inc.start]);
            at = inc.end;
            let lines_after = inc.line + src[inc.start..inc.end].matches('\n').count() + 1;
            match self.find(&inc, dir) {
                _ if depth >= MAX_DEPTH => self.error(&inc, "includes nest too deeply"),
                // Headers that include each other without `#pragma once`
                // would be copied again and again (guards only act later).
                _ if self.out.len() > MAX_OUTPUT => {
                    self.error(&inc, "the program with its headers passes 64 MiB")
                }
                Found::Missing(why) => self.error(&inc, &why),
                Found::Text {
                    key,
                    dir: hdir,
                    text,
                } => {
                    let text = match without_pragma_once(&text) {
                        None => text,
                        Some(_) if !self.once.insert(key.clone()) => {
                            self.out
                                .push_str(&format!("#line {lines_after} {}", quoted(name)));
                            continue;
                        }
                        // Inlined, the pragma would be one in the main file
                        // (a warning, an error with -Werror).
                        Some(t) => t,
                    };
                    self.out.push_str(&format!("#line 1 {}\n", quoted(&key)));
                    self.inline(&text, hdir.as_deref(), &key, depth + 1);
                    if !self.out.ends_with('\n') {
                        self.out.push('\n');
                    }
                    self.out
                        .push_str(&format!("#line {lines_after} {}", quoted(name)));
                }
            }
        }
        self.out.push_str(&src[at..]);
    }

    fn error(&mut self, inc: &Include, why: &str) {
        self.misses += 1;
        self.out.push_str(&format!(
            "#error {}",
            quoted(&format!(
                "crane: #{} {}: {why}",
                inc.name,
                spelled(&inc.operand)
            ))
        ));
    }

    fn find(&self, inc: &Include, dir: Option<&Path>) -> Found {
        if inc.name == "embed" {
            return Found::Missing("#embed is not supported through crane-proxy".into());
        }
        let (name, quoted_form) = match &inc.operand {
            Operand::Quoted(n) => (n, true),
            Operand::Angled(n) => (n, false),
            Operand::Other(_) => {
                return Found::Missing(
                    "an include named by a macro cannot be resolved for crane-proxy".into(),
                );
            }
        };
        if let Some((n, text)) = self.embedded.iter().find(|(n, _)| n == name) {
            return Found::Text {
                key: n.clone(),
                dir: None,
                text: text.clone(),
            };
        }
        let mut candidates: Vec<PathBuf> = Vec::new();
        let p = Path::new(name);
        if p.is_absolute() {
            candidates.push(p.to_path_buf());
        } else {
            if quoted_form && let Some(d) = dir {
                candidates.push(d.join(p));
            }
            candidates.extend(self.dirs.iter().map(|d| d.join(p)));
            if quoted_form && let Some(c) = &self.cwd {
                candidates.push(c.join(p));
            }
        }
        for c in candidates {
            if let Ok(text) = std::fs::read(&c) {
                let key = c.to_string_lossy().into_owned();
                return Found::Text {
                    dir: c.parent().map(Path::to_path_buf),
                    key,
                    text: String::from_utf8_lossy(&text).into_owned(),
                };
            }
        }
        Found::Missing("file not found".into())
    }
}

fn spelled(op: &Operand) -> String {
    match op {
        Operand::Quoted(n) => format!("\"{n}\""),
        Operand::Angled(n) => format!("<{n}>"),
        Operand::Other(t) => t.clone(),
    }
}

/// A string literal for `#line` and `#error`.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            '\n' | '\r' => q.push(' '),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn is_pragma_once(line: &str) -> bool {
    line.trim_start()
        .strip_prefix('#')
        .map(str::trim_start)
        .and_then(|l| l.strip_prefix("pragma"))
        .is_some_and(|l| l.split_whitespace().next() == Some("once"))
}

/// `text` with its `#pragma once` lines emptied, if it has one.
fn without_pragma_once(text: &str) -> Option<String> {
    if !text.lines().any(is_pragma_once) {
        return None;
    }
    Some(
        text.split_inclusive('\n')
            .map(|l| {
                if is_pragma_once(l) {
                    if l.ends_with('\n') { "\n" } else { "" }
                } else {
                    l
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn includes_are_inlined_from_i_dirs_with_line_markers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.h"), "#define A 1\n#include \"b.h\"\n").unwrap();
        std::fs::write(dir.path().join("b.h"), "#define B 2").unwrap();
        let src = "// top\n#include <a.h>\nint x = A + B;\n";
        let opts = format!("-DX -I {} -cl-std=CL1.2", dir.path().display());
        let p = prepare(src, &opts, &[]);
        assert_eq!(p.options, "-DX -cl-std=CL1.2");
        let a = dir.path().join("a.h").display().to_string();
        let b = dir.path().join("b.h").display().to_string();
        assert_eq!(
            p.source,
            format!(
                "// top\n#line 1 \"{a}\"\n#define A 1\n#line 1 \"{b}\"\n#define B 2\n#line 3 \"{a}\"\n\
                 #line 3 \"<source>\"\nint x = A + B;\n"
            )
        );
        assert!(include_directives(&p.source).is_empty());
    }

    #[test]
    fn embedded_headers_come_first_and_pragma_once_holds() {
        let hdr = ("h.h".to_owned(), "#pragma once\nint h;\n".to_owned());
        let src = "#include \"h.h\"\n#include \"h.h\"\nint y;\n";
        let p = prepare(src, "", &[hdr]);
        assert_eq!(
            p.source,
            "#line 1 \"h.h\"\n\nint h;\n#line 2 \"<source>\"\n#line 3 \"<source>\"\nint y;\n"
        );
    }

    #[test]
    fn what_cannot_be_resolved_becomes_an_error_in_place() {
        let src = "#if 0\n#include \"/nonexistent/x.h\"\n#endif\n#include NAME\n";
        let p = prepare(src, "", &[]);
        assert_eq!(
            p.source,
            "#if 0\n#error \"crane: #include \\\"/nonexistent/x.h\\\": file not found\"\n#endif\n\
             #error \"crane: #include NAME: an include named by a macro cannot be resolved for crane-proxy\"\n"
        );
        assert!(include_directives(&p.source).is_empty());
    }

    #[test]
    fn a_header_that_includes_itself_stops() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("r.h"), "#include \"r.h\"\n").unwrap();
        let p = prepare(
            "#include \"r.h\"\n",
            &format!("-I{}", dir.path().display()),
            &[],
        );
        assert!(p.source.contains("includes nest too deeply"));
        assert!(include_directives(&p.source).is_empty());
    }
}
