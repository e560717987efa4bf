//! What both sides need to know about OpenCL C source and build options
//! that crosses to crane-proxy: which lines read files when compiled, and
//! which options name files.
//!
//! A compiler in crane-proxy reads files on the proxy domain's filesystem,
//! not the guest's: a tenant's `#include "/run/crane/proxy/tokens"` would
//! put another tenant's token into its build log, and natively an include
//! names a file of the application's own machine anyway. So the client
//! resolves includes on its machine and sends source without any
//! ([`include_directives`] finds them; the interposer inlines them), and
//! crane-proxy refuses to compile source that still has one, and options
//! that make the compiler read files ([`forbidden_option`]).

/// How an include-like directive names its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operand {
    /// `"name"`.
    Quoted(String),
    /// `<name>`.
    Angled(String),
    /// Anything else (a macro that expands to a name), as written.
    Other(String),
}

/// A preprocessing directive that reads a file: `#include`, `#include_next`,
/// `#import` or `#embed`, in any spelling the preprocessor accepts (`%:`
/// digraph, `??=` trigraph, comments and line splices between the tokens).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Include {
    /// Byte range in the source of the whole directive, from the start of
    /// its line to the end of its last physical line (without the newline).
    pub start: usize,
    pub end: usize,
    /// 1-based physical line the directive starts on.
    pub line: usize,
    /// `include`, `include_next`, `import` or `embed`.
    pub name: String,
    pub operand: Operand,
}

const READS_FILES: [&str; 4] = ["include", "include_next", "import", "embed"];

/// Every include-like directive of `src`, in order, outside comments and
/// literals.
pub fn include_directives(src: &str) -> Vec<Include> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut line = 1;
    let mut line_start = 0;
    let mut at_start = true;
    while i < b.len() {
        match b[i] {
            b'\\' if next_is_newline(b, i + 1) => {
                let (n, _) = newline_len(b, i + 1);
                i += 1 + n;
                line += 1;
            }
            b'\n' => {
                i += 1;
                line += 1;
                line_start = i;
                at_start = true;
            }
            b'/' if peek(b, i + 1) == Some(b'/') => i = skip_line_comment(b, i, &mut line),
            b'/' if peek(b, i + 1) == Some(b'*') => i = skip_block_comment(b, i, &mut line),
            b' ' | b'\t' | b'\r' | 0x0b | 0x0c => i += 1,
            _ if at_start && hash_len(b, i) > 0 => {
                let first_line = line;
                let start = line_start;
                let (end, next, name, operand) = directive(b, i + hash_len(b, i), &mut line);
                if READS_FILES.contains(&name.as_str()) {
                    out.push(Include {
                        start,
                        end,
                        line: first_line,
                        name,
                        operand,
                    });
                }
                i = next;
                at_start = false;
            }
            q @ (b'"' | b'\'') => {
                i = skip_literal(b, i, q, &mut line);
                at_start = false;
            }
            _ => {
                i += 1;
                at_start = false;
            }
        }
    }
    out
}

fn peek(b: &[u8], i: usize) -> Option<u8> {
    b.get(i).copied()
}

fn next_is_newline(b: &[u8], i: usize) -> bool {
    newline_len(b, i).0 > 0
}

/// The length of a newline at `i` (`\n` or `\r\n`), and whether there is one.
fn newline_len(b: &[u8], i: usize) -> (usize, bool) {
    match (peek(b, i), peek(b, i + 1)) {
        (Some(b'\n'), _) => (1, true),
        (Some(b'\r'), Some(b'\n')) => (2, true),
        _ => (0, false),
    }
}

/// `#`, `%:` or `??=` at `i`: its length, or 0.
fn hash_len(b: &[u8], i: usize) -> usize {
    match (peek(b, i), peek(b, i + 1), peek(b, i + 2)) {
        (Some(b'#'), ..) => 1,
        (Some(b'%'), Some(b':'), _) => 2,
        (Some(b'?'), Some(b'?'), Some(b'=')) => 3,
        _ => 0,
    }
}

fn skip_line_comment(b: &[u8], mut i: usize, line: &mut usize) -> usize {
    while i < b.len() && b[i] != b'\n' {
        if b[i] == b'\\' && next_is_newline(b, i + 1) {
            i += 1 + newline_len(b, i + 1).0;
            *line += 1;
        } else {
            i += 1;
        }
    }
    i
}

fn skip_block_comment(b: &[u8], mut i: usize, line: &mut usize) -> usize {
    i += 2;
    while i < b.len() {
        if b[i] == b'*' && peek(b, i + 1) == Some(b'/') {
            return i + 2;
        }
        if b[i] == b'\n' {
            *line += 1;
        }
        i += 1;
    }
    i
}

/// Skips a string or character literal opening at `i` (to its closing quote
/// or the end of the line).
fn skip_literal(b: &[u8], mut i: usize, quote: u8, line: &mut usize) -> usize {
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' if next_is_newline(b, i + 1) => {
                i += 1 + newline_len(b, i + 1).0;
                *line += 1;
            }
            b'\\' => i += 2,
            b'\n' => return i,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    // A backslash as the last byte stepped past the end.
    i.min(b.len())
}

/// The directive whose name starts after the `#` at `i`: (end of its text,
/// where scanning resumes, its name, its operand). Comments inside it count
/// as spaces; a comment that spans lines extends the directive.
fn directive(b: &[u8], mut i: usize, line: &mut usize) -> (usize, usize, String, Operand) {
    let mut text = Vec::new();
    let mut end = i;
    while i < b.len() {
        match b[i] {
            b'\\' if next_is_newline(b, i + 1) => {
                i += 1 + newline_len(b, i + 1).0;
                *line += 1;
            }
            b'\n' => break,
            b'/' if peek(b, i + 1) == Some(b'/') => {
                i = skip_line_comment(b, i, line);
            }
            b'/' if peek(b, i + 1) == Some(b'*') => {
                i = skip_block_comment(b, i, line);
                text.push(b' ');
            }
            q @ (b'"' | b'\'') => {
                let s = i;
                i = skip_literal(b, i, q, line);
                text.extend_from_slice(&b[s..i]);
            }
            c => {
                text.push(c);
                i += 1;
            }
        }
        end = i;
    }
    let text = String::from_utf8_lossy(&text).into_owned();
    let text = text.trim_start();
    let name_len = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    let name = text[..name_len].to_owned();
    let rest = text[name_len..].trim();
    let operand = if let Some(q) = rest.strip_prefix('"').and_then(|r| r.split_once('"')) {
        Operand::Quoted(q.0.to_owned())
    } else if let Some(a) = rest.strip_prefix('<').and_then(|r| r.split_once('>')) {
        Operand::Angled(a.0.to_owned())
    } else {
        Operand::Other(rest.to_owned())
    };
    let end = end.min(b.len());
    // Trailing carriage return of a CRLF line is not part of the text.
    let end = if end > 0 && b.get(end - 1) == Some(&b'\r') {
        end - 1
    } else {
        end
    };
    (end, i, name, operand)
}

/// `src` as the preprocessor sees it before it looks for directives: a
/// byte-order mark dropped, CR and CRLF line ends made LF, trigraphs
/// replaced, line splices (a backslash, optional blanks, a newline) removed,
/// and Unicode white space made a space. [`include_directives`] works on the
/// source as written (its spans index it); crane-proxy's refusal scans this
/// form, so that no spelling the scanner does not follow (a lone CR as a line
/// end, `??/` or `\ ` before a newline, an escaped `*/`) hides a directive.
pub fn normalize(src: &str) -> String {
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let src = src.replace("\r\n", "\n").replace('\r', "\n");
    let tri = |c: char| match c {
        '=' => Some('#'),
        '/' => Some('\\'),
        '\'' => Some('^'),
        '(' => Some('['),
        ')' => Some(']'),
        '!' => Some('|'),
        '<' => Some('{'),
        '>' => Some('}'),
        '-' => Some('~'),
        _ => None,
    };
    let chars: Vec<char> = src.chars().collect();
    let mut t = String::with_capacity(src.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '?'
            && chars.get(i + 1) == Some(&'?')
            && let Some(r) = chars.get(i + 2).copied().and_then(tri)
        {
            t.push(r);
            i += 3;
            continue;
        }
        let c = chars[i];
        t.push(if c != '\n' && c.is_whitespace() {
            ' '
        } else {
            c
        });
        i += 1;
    }
    // Splices: a backslash, blanks, a newline.
    let b: Vec<char> = t.chars().collect();
    let mut out = String::with_capacity(t.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == '\\' {
            let mut j = i + 1;
            while j < b.len() && (b[j] == ' ' || b[j] == '\t') {
                j += 1;
            }
            if b.get(j) == Some(&'\n') {
                i = j + 1;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

/// Whether `src` has a directive that reads a file, in any spelling the
/// preprocessor accepts (see [`normalize`]): what crane-proxy refuses to
/// compile.
pub fn reads_files(src: &str) -> bool {
    !include_directives(&normalize(src)).is_empty()
}

/// The first build option crane-proxy does not take, if any. Options are an
/// allow-list: `-D`/`-U` macros (joined, or followed by a name), `-cl-*`,
/// `-nv-*`, `-w`, `-W*` warnings, `-g`, `-O0`..`-O3`, `-x` with a language,
/// `-spir-std=`, `-create-library`, `-enable-link-options`. Anything else —
/// include paths, forced includes, response files, plugins, pass-through to
/// the driver, a bare word the compiler would take for an input file — and
/// any control character other than a space or tab (a separator the
/// filter would not split on) is refused: crane-proxy answers a build with
/// CL_INVALID_BUILD_OPTIONS (compile: CL_INVALID_COMPILER_OPTIONS, link:
/// CL_INVALID_LINKER_OPTIONS). The client resolves `-I` itself and leaves it
/// out.
pub fn forbidden_option(options: &str) -> Option<String> {
    if let Some(c) = options
        .chars()
        .find(|&c| (c.is_control() && c != ' ' && c != '\t') || !c.is_ascii())
    {
        return Some(format!("{c:?}"));
    }
    let ident = |v: &str| v.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
    let mut it = options
        .split([' ', '\t'])
        .filter(|t| !t.is_empty())
        .peekable();
    while let Some(t) = it.next() {
        let ok = match t {
            "-D" | "-U" => it.next().is_some_and(ident),
            "-x" => it
                .next()
                .is_some_and(|v| v.chars().all(|c| c.is_ascii_alphanumeric() || c == '+')),
            "-w" | "-g" | "-create-library" | "-enable-link-options" => true,
            "-O0" | "-O1" | "-O2" | "-O3" => true,
            _ => {
                (t.starts_with("-D") || t.starts_with("-U")) && ident(&t[2..])
                    || t.starts_with("-cl-")
                    || t.starts_with("-nv-")
                    || t.starts_with("-spir-std=")
                    || (t.starts_with("-W")
                        && !t.starts_with("-Wp,")
                        && !t.starts_with("-Wl,")
                        && !t.starts_with("-Wa,"))
            }
        };
        if !ok {
            return Some(t.to_owned());
        }
    }
    None
}

/// `-I DIR` and `-IDIR` taken out of `options`: (the directories in order,
/// the options without them).
pub fn take_include_dirs(options: &str) -> (Vec<String>, String) {
    let mut dirs = Vec::new();
    let mut rest = Vec::new();
    let mut it = options.split_ascii_whitespace();
    while let Some(t) = it.next() {
        if t == "-I" {
            if let Some(d) = it.next() {
                dirs.push(d.to_owned());
            }
        } else if let Some(d) = t.strip_prefix("-I") {
            dirs.push(d.to_owned());
        } else {
            rest.push(t);
        }
    }
    (dirs, rest.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(src: &str) -> Vec<Operand> {
        include_directives(src)
            .into_iter()
            .map(|i| i.operand)
            .collect()
    }

    #[test]
    fn finds_every_spelling_of_an_include() {
        let src = "#include \"a.h\"\n  #  include <b.h>\n%:include \"c.h\"\n??=include \"d.h\"\n\
                   #/* x */include/* y */\"e.h\"\n#\\\ninclude \"f.h\"\n#include_next <g.h>\n\
                   #import \"h.h\"\n#embed \"i.bin\"\n#include NAME\n";
        assert_eq!(
            ops(src),
            vec![
                Operand::Quoted("a.h".into()),
                Operand::Angled("b.h".into()),
                Operand::Quoted("c.h".into()),
                Operand::Quoted("d.h".into()),
                Operand::Quoted("e.h".into()),
                Operand::Quoted("f.h".into()),
                Operand::Angled("g.h".into()),
                Operand::Quoted("h.h".into()),
                Operand::Quoted("i.bin".into()),
                Operand::Other("NAME".into()),
            ]
        );
    }

    #[test]
    fn ignores_comments_literals_and_other_directives() {
        let src = "// #include \"a.h\"\n/* #include \"b.h\"\n#include \"c.h\" */\n\
                   const char *s = \"#include \\\"d.h\\\"\";\nint x; #include \"e.h\"\n\
                   #define INC \"f.h\"\n#pragma once\n/* \"*/ #include \"g.h\"\n";
        // The last line is a directive: a comment counts as a space, so the
        // '#' is the line's first token.
        assert_eq!(ops(src), vec![Operand::Quoted("g.h".into())]);
    }

    #[test]
    fn a_comment_opened_in_a_string_is_no_comment() {
        let src = "char *s = \"/*\";\n#include \"a.h\"\nchar *t = \"*/\";\n";
        assert_eq!(ops(src), vec![Operand::Quoted("a.h".into())]);
    }

    #[test]
    fn spans_cover_the_directive_lines() {
        let src = "x\r\n#include \\\n \"a.h\"\r\ny\n";
        let d = &include_directives(src)[0];
        assert_eq!(d.line, 2);
        assert_eq!(&src[d.start..d.end], "#include \\\n \"a.h\"");
    }

    #[test]
    fn options_that_read_files_are_named() {
        for bad in [
            "-I/etc",
            "-I /etc",
            "-DX -include /etc/passwd",
            "@/tmp/opts",
            "-imacros x.h",
            "-Xclang -load",
            "-fplugin=x.so",
            "-Wp,-MD,/tmp/x",
        ] {
            assert!(forbidden_option(bad).is_some(), "{bad}");
        }
        for good in [
            "",
            "-cl-std=CL2.0 -cl-fast-relaxed-math",
            "-DN=4 -D M=5 -w -Werror -UX",
            "-cl-kernel-arg-info -g -x spir",
            "-cl-nv-maxrregcount=32 -nv-line-info -O2",
        ] {
            assert_eq!(forbidden_option(good), None, "{good}");
        }
        // Allowed, not merely not denied: a stray word is an input file to
        // a compiler driver, a vertical tab a separator to some parsers.
        for bad in [
            "-DX /etc/passwd",
            "-D -include /x",
            "-DX\x0b-include\x0b/x",
            "-fsanitize-ignorelist=/x",
            "-mllvm -x",
            "-MF /tmp/x",
            "-Wl,-x",
            "-x ../x",
        ] {
            assert!(forbidden_option(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn normalized_source_shows_every_hidden_include() {
        for hidden in [
            "int x;\r#include \"/f\"\n",
            "#\\   \ninclude \"/f\"\n",
            "/* *\\\n/\n#include \"/f\"\n// */\n",
            "#??/\ninclude \"/f\"\n",
            "\u{feff}#include \"/f\"\n",
            "\u{a0}#include \"/f\"\n",
        ] {
            assert!(reads_files(hidden), "{hidden:?}");
        }
        assert!(!reads_files("// #include \"/f\"\nint x;\n"));
    }

    #[test]
    fn include_dirs_are_taken_out() {
        assert_eq!(
            take_include_dirs("-DA -I inc -I/x/y -cl-std=CL1.2"),
            (
                vec!["inc".to_owned(), "/x/y".to_owned()],
                "-DA -cl-std=CL1.2".to_owned()
            )
        );
    }
}
