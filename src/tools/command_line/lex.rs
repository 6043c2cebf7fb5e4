//! Splitting a command line into commands of words the way `sh` does: quotes and backslashes
//! removed, redirections taken out of the words (their targets are file names), the commands of
//! `$(…)`, `` `…` `` and `<(…)` read as commands of their own, and what only the running shell
//! knows (`$VAR`, `$(…)`'s output) kept as a [`MARK`] in the word.

use super::Unreadable;

/// Stands in a word for text known only when the line runs (a variable, a substitution's
/// output). A line holding it is refused, so no text can forge one.
pub(super) const MARK: char = '\u{1}';

/// Substitutions nested deeper than this are not read (`$($($(…)))`).
const MAX_NESTING: usize = 24;

/// One word after quote removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Word {
    /// The text, with a [`MARK`] for each expansion.
    pub(super) text: String,
    /// An unquoted `*`, `?`, `[…]` or `{a,b}`: the shell may replace the word with others.
    pub(super) glob: bool,
    /// Bytes of `text` before the first quoted, escaped or expanded character.
    pub(super) plain: usize,
    /// An unquoted expansion (or `"$@"`): the shell splits its value into any number of words.
    pub(super) split: bool,
}

impl Word {
    /// A word as written, with nothing to expand.
    pub(super) fn literal(text: &str) -> Self {
        Self {
            text: text.to_string(),
            glob: false,
            plain: text.len(),
            split: false,
        }
    }

    /// `NAME=value` (or `NAME+=value`) with an unquoted, valid name.
    pub(super) fn assignment(&self) -> Option<&str> {
        let (name, _) = self.text.split_once('=')?;
        let name = name.strip_suffix('+').unwrap_or(name);
        let valid = !name.is_empty()
            && name.len() < self.plain
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        valid.then_some(name)
    }

    /// Whether part of it is known only at run time.
    pub(super) fn dynamic(&self) -> bool {
        self.text.contains(MARK)
    }

    /// Whether it is the unquoted reserved word `keyword`.
    pub(super) fn is_keyword(&self, keyword: &str) -> bool {
        self.plain == self.text.len() && self.text == keyword
    }
}

/// A word being built by the lexer.
#[derive(Default)]
struct Building {
    text: String,
    glob: bool,
    plain: Option<usize>,
    started: bool,
    split: bool,
    /// Where an unquoted `[` or `{` was, to see at the end whether it makes a pattern.
    bracket: Option<usize>,
    brace: Option<usize>,
}

impl Building {
    fn push(&mut self, c: char) {
        self.started = true;
        match c {
            '*' | '?' => self.glob = true,
            '[' => {
                self.bracket.get_or_insert(self.text.len());
            }
            '{' => {
                self.brace.get_or_insert(self.text.len());
            }
            _ => {}
        }
        self.text.push(c);
    }

    fn push_quoted(&mut self, c: char) {
        self.quoted();
        self.text.push(c);
    }

    fn quoted(&mut self) {
        self.started = true;
        self.plain.get_or_insert(self.text.len());
    }

    /// An expansion's value; `split` when the shell splits it into words.
    fn expansion(&mut self, split: bool) {
        self.quoted();
        self.text.push(MARK);
        self.split |= split;
    }

    fn finish(&mut self) -> Option<Word> {
        let building = std::mem::take(self);
        if !building.started {
            return None;
        }
        let text = building.text;
        let pattern_after = |at: Option<usize>, close: char, inner: &[&str]| {
            at.and_then(|at| text.get(at + 1..)).is_some_and(|rest| {
                rest.split_once(close).is_some_and(|(inside, _)| {
                    inner.is_empty() || inner.iter().any(|s| inside.contains(s))
                })
            })
        };
        let glob = building.glob
            || pattern_after(building.bracket, ']', &[])
            || pattern_after(building.brace, '}', &[",", ".."]);
        Some(Word {
            plain: building.plain.unwrap_or(text.len()),
            text,
            glob,
            split: building.split,
        })
    }
}

/// Where a command's standard input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Input {
    /// The output of the command before it in a pipe.
    Pipe,
    /// A file (`< f`).
    File,
    /// A here-document or here-string: its text.
    Text(String),
}

/// One command of a line: its words and where its input comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Segment {
    pub(super) words: Vec<Word>,
    pub(super) input: Option<Input>,
    /// It runs inside a substitution (`$(…)`, `` `…` ``, `<(…)`).
    pub(super) substituted: bool,
}

const OPEN_QUOTE: Unreadable = Unreadable("quoting that does not close");
const CONTROL: Unreadable = Unreadable("a control character");
const HISTORY: Unreadable = Unreadable("history expansion (!, ^) of an interactive shell");
const COMPOUND: Unreadable = Unreadable("a case … esac the rules do not follow");
const UNMATCHED: Unreadable = Unreadable("a parenthesis that does not match");
const DANGLING: Unreadable = Unreadable("a redirection without its target");
const TOO_NESTED: Unreadable = Unreadable("substitutions nested deeper than the rules follow");

/// A redirection waiting for its target word.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Redirect {
    /// Output, or a duplicated descriptor: the target is a file name (or a number).
    Out,
    /// `< FILE`.
    In,
    /// `<<WORD` (`strip`: `<<-`).
    HereDoc { strip: bool },
    /// `<<< WORD`.
    HereString,
}

/// A here-document whose body follows the next newline.
struct PendingDoc {
    delimiter: String,
    strip: bool,
    /// Unquoted delimiter: the body's `$(…)` and `` `…` `` run.
    expands: bool,
    segment: Option<usize>,
}

/// The command being read: its words so far.
#[derive(Default)]
struct Command {
    words: Vec<Word>,
    word: Building,
    input: Option<Input>,
    redirect: Option<Redirect>,
    doc: Option<(String, bool, bool)>,
}

/// The lexer's state over one text.
struct Lexer {
    chars: Vec<char>,
    i: usize,
    typed: bool,
    out: Vec<Segment>,
    docs: Vec<PendingDoc>,
    depth: usize,
}

/// Splits `text` into commands of words at unquoted `|`, `||`, `|&`, `&&`, `;`, `&`, newlines
/// and parentheses, the way `sh` would, or says why it cannot.
pub(super) fn segments(text: &str, typed: bool) -> Result<Vec<Segment>, Unreadable> {
    segments_at(text, typed, 0)
}

fn segments_at(text: &str, typed: bool, depth: usize) -> Result<Vec<Segment>, Unreadable> {
    if text.contains(MARK) {
        return Err(CONTROL);
    }
    if depth > MAX_NESTING {
        return Err(TOO_NESTED);
    }
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        i: 0,
        typed,
        out: Vec::new(),
        docs: Vec::new(),
        depth,
    };
    lexer.list(false, false)?;
    if typed && !lexer.docs.is_empty() {
        return Err(Unreadable(
            "a here-document whose end a later write_stdin would type",
        ));
    }
    Ok(lexer.out)
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.i + ahead).copied()
    }

    /// Reads commands up to the end of the text or, with `close`, to the `)` that ends a
    /// substitution (consumed).
    fn list(&mut self, close: bool, substituted: bool) -> Result<(), Unreadable> {
        let mut cmd = Command::default();
        let mut parens = 0usize;
        loop {
            let Some(c) = self.peek(0) else {
                if close || parens > 0 {
                    return Err(UNMATCHED);
                }
                return self.end(&mut cmd, substituted, None);
            };
            let next = self.peek(1);
            match c {
                ' ' | '\t' => self.finish_word(&mut cmd)?,
                '\n' => {
                    self.end(&mut cmd, substituted, None)?;
                    self.i += 1;
                    self.here_docs()?;
                    continue;
                }
                '\r' if self.typed => self.end(&mut cmd, substituted, None)?,
                '#' if !cmd.word.started => {
                    while self.peek(1).is_some_and(|c| c != '\n') {
                        self.i += 1;
                    }
                }
                '\'' => {
                    cmd.word.quoted();
                    loop {
                        self.i += 1;
                        match self.peek(0) {
                            None => return Err(OPEN_QUOTE),
                            Some('\'') => break,
                            Some(c) => cmd.word.push_quoted(c),
                        }
                    }
                }
                '"' => {
                    self.i += 1;
                    self.double_quoted(&mut cmd.word, Some('"'))?;
                    continue;
                }
                '\\' => match next {
                    Some('\n') => self.i += 1,
                    Some(e) => {
                        cmd.word.push_quoted(e);
                        self.i += 1;
                    }
                    None => return Err(OPEN_QUOTE),
                },
                '$' => {
                    self.dollar(&mut cmd.word, false)?;
                    continue;
                }
                '`' => {
                    self.backtick(&mut cmd.word, false)?;
                    continue;
                }
                '<' | '>' if next == Some('(') => {
                    self.i += 2;
                    self.substitution()?;
                    cmd.word.expansion(false);
                    continue;
                }
                '<' | '>' => {
                    self.redirect(&mut cmd)?;
                    continue;
                }
                '&' if next == Some('>') => {
                    self.redirect(&mut cmd)?;
                    continue;
                }
                '(' => {
                    self.end(&mut cmd, substituted, None)?;
                    parens += 1;
                }
                ')' => {
                    self.end(&mut cmd, substituted, None)?;
                    if parens > 0 {
                        parens -= 1;
                    } else if close {
                        self.i += 1;
                        return Ok(());
                    } else {
                        return Err(UNMATCHED);
                    }
                }
                '|' | '&' => {
                    let pipe = c == '|' && next != Some('|');
                    if matches!((c, next), ('|', Some('|' | '&')) | ('&', Some('&'))) {
                        self.i += 1;
                    }
                    self.end(&mut cmd, substituted, pipe.then_some(Input::Pipe))?;
                }
                ';' => {
                    if matches!(next, Some(';' | '&')) {
                        return Err(COMPOUND);
                    }
                    self.end(&mut cmd, substituted, None)?;
                }
                '!' if self.typed => return Err(HISTORY),
                '^' if self.typed && !cmd.word.started && cmd.words.is_empty() => {
                    return Err(HISTORY);
                }
                c if c.is_control() => return Err(CONTROL),
                c => cmd.word.push(c),
            }
            self.i += 1;
        }
    }

    /// Ends the word being built: an argument, or the target of a pending redirection.
    fn finish_word(&mut self, cmd: &mut Command) -> Result<(), Unreadable> {
        let Some(word) = cmd.word.finish() else {
            return Ok(());
        };
        match cmd.redirect.take() {
            None => cmd.words.push(word),
            Some(Redirect::Out) => {}
            Some(Redirect::In) => cmd.input = Some(Input::File),
            Some(Redirect::HereString) => cmd.input = Some(Input::Text(word.text)),
            Some(Redirect::HereDoc { strip }) => {
                if word.dynamic() {
                    return Err(Unreadable("a here-document delimiter with an expansion"));
                }
                let expands = word.plain == word.text.len();
                cmd.doc = Some((word.text, strip, expands));
            }
        }
        Ok(())
    }

    /// Ends the command being read; `next` is the input of the one after it.
    fn end(
        &mut self,
        cmd: &mut Command,
        substituted: bool,
        next: Option<Input>,
    ) -> Result<(), Unreadable> {
        self.finish_word(cmd)?;
        if cmd.redirect.is_some() {
            return Err(DANGLING);
        }
        let done = std::mem::take(cmd);
        let segment = (!done.words.is_empty()).then(|| {
            self.out.push(Segment {
                words: done.words,
                input: done.input,
                substituted,
            });
            self.out.len() - 1
        });
        if let Some((delimiter, strip, expands)) = done.doc {
            self.docs.push(PendingDoc {
                delimiter,
                strip,
                expands,
                segment,
            });
        }
        cmd.input = next;
        Ok(())
    }

    /// Reads the bodies of the here-documents started on the line just ended.
    fn here_docs(&mut self) -> Result<(), Unreadable> {
        for doc in std::mem::take(&mut self.docs) {
            let mut body = String::new();
            let mut closed = false;
            while self.i < self.chars.len() {
                let end = (self.i..self.chars.len())
                    .find(|&k| self.chars[k] == '\n')
                    .unwrap_or(self.chars.len());
                let line: String = self.chars[self.i..end].iter().collect();
                self.i = (end + 1).min(self.chars.len());
                let line = if doc.strip {
                    line.trim_start_matches('\t').to_string()
                } else {
                    line
                };
                if line == doc.delimiter {
                    closed = true;
                    break;
                }
                body.push_str(&line);
                body.push('\n');
            }
            if !closed && self.typed {
                return Err(Unreadable(
                    "a here-document whose end a later write_stdin would type",
                ));
            }
            if doc.expands {
                self.expand_inside(&body)?;
            }
            if let Some(segment) = doc.segment {
                self.out[segment].input = Some(Input::Text(body));
            }
        }
        Ok(())
    }

    /// Reads a redirection operator at `self.i` (and a descriptor number before it).
    fn redirect(&mut self, cmd: &mut Command) -> Result<(), Unreadable> {
        let descriptor = cmd.word.started
            && cmd.word.plain.is_none()
            && cmd.word.text.chars().all(|c| c.is_ascii_digit());
        if descriptor {
            cmd.word = Building::default();
        } else {
            self.finish_word(cmd)?;
        }
        if cmd.redirect.is_some() {
            return Err(DANGLING);
        }
        let ahead = |k| self.peek(k);
        let (kind, length) = match (ahead(0), ahead(1), ahead(2)) {
            (Some('&'), Some('>'), Some('>')) => (Redirect::Out, 3),
            (Some('&'), Some('>'), _) => (Redirect::Out, 2),
            (Some('<'), Some('<'), Some('<')) => (Redirect::HereString, 3),
            (Some('<'), Some('<'), Some('-')) => (Redirect::HereDoc { strip: true }, 3),
            (Some('<'), Some('<'), _) => (Redirect::HereDoc { strip: false }, 2),
            (Some('<'), Some('&' | '>'), _) => (Redirect::Out, 2),
            (Some('<'), ..) => (Redirect::In, 1),
            (Some('>'), Some('>' | '|' | '&'), _) => (Redirect::Out, 2),
            _ => (Redirect::Out, 1),
        };
        self.i += length;
        cmd.redirect = Some(kind);
        Ok(())
    }

    /// Reads the commands of the substitutions in `text` (a here-document's body, `${…}`,
    /// `$((…))`), expanded as inside double quotes.
    fn expand_inside(&mut self, text: &str) -> Result<(), Unreadable> {
        if self.depth >= MAX_NESTING {
            return Err(TOO_NESTED);
        }
        let mut inner = Lexer {
            chars: text.chars().collect(),
            i: 0,
            typed: self.typed,
            out: Vec::new(),
            docs: Vec::new(),
            depth: self.depth + 1,
        };
        inner.double_quoted(&mut Building::default(), None)?;
        for segment in &mut inner.out {
            segment.substituted = true;
        }
        self.out.append(&mut inner.out);
        Ok(())
    }

    /// Reads the inside of double quotes from `self.i` up to `end` (consumed), or to the end of
    /// the text for a here-document's body.
    fn double_quoted(&mut self, word: &mut Building, end: Option<char>) -> Result<(), Unreadable> {
        word.quoted();
        loop {
            let Some(c) = self.peek(0) else {
                return if end.is_none() {
                    Ok(())
                } else {
                    Err(OPEN_QUOTE)
                };
            };
            match c {
                c if Some(c) == end => {
                    self.i += 1;
                    return Ok(());
                }
                '$' => {
                    self.dollar(word, true)?;
                    continue;
                }
                '`' => {
                    self.backtick(word, true)?;
                    continue;
                }
                '!' if self.typed && end.is_some() => return Err(HISTORY),
                '\\' => match self.peek(1) {
                    Some('\n') => self.i += 1,
                    Some(e @ ('$' | '`' | '"' | '\\')) => {
                        word.push_quoted(e);
                        self.i += 1;
                    }
                    _ => word.push_quoted('\\'),
                },
                c => word.push_quoted(c),
            }
            self.i += 1;
        }
    }

    /// Reads an expansion starting with `$` at `self.i`.
    fn dollar(&mut self, word: &mut Building, quoted: bool) -> Result<(), Unreadable> {
        let next = self.peek(1);
        match next {
            Some('(') if self.peek(2) == Some('(') => {
                self.i += 3;
                let inside = self.balanced('(', ')')?;
                if self.peek(0) != Some(')') {
                    return Err(UNMATCHED);
                }
                self.i += 1;
                // Its substitutions run, and so do those of array subscripts.
                self.expand_inside(&inside)?;
                word.expansion(!quoted);
            }
            Some('(') => {
                self.i += 2;
                self.substitution()?;
                word.expansion(!quoted);
            }
            Some('{') => {
                self.i += 2;
                let inside = self.balanced('{', '}')?;
                if inside.contains('@') && !inside.ends_with("[@]") && inside != "@" {
                    return Err(Unreadable(
                        "a ${…@…} transformation, which can run the text it expands",
                    ));
                }
                self.expand_inside(&inside)?;
                word.expansion(!quoted || inside.ends_with("[@]") || inside.ends_with("[*]"));
            }
            Some('\'') if !quoted => {
                // $'…' decodes escapes: its text is not what the rules would see.
                self.i += 2;
                loop {
                    match self.peek(0) {
                        None => return Err(OPEN_QUOTE),
                        Some('\'') => break,
                        Some('\\') => self.i += 2,
                        Some(_) => self.i += 1,
                    }
                }
                self.i += 1;
                word.expansion(false);
            }
            Some('"') if !quoted => {
                self.i += 2;
                self.double_quoted(word, Some('"'))?;
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                self.i += 1;
                while self
                    .peek(0)
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    self.i += 1;
                }
                word.expansion(!quoted);
            }
            Some(c) if c.is_ascii_digit() || "@*#?$!-".contains(c) => {
                self.i += 2;
                word.expansion(!quoted || c == '@');
            }
            _ => {
                if quoted {
                    word.push_quoted('$');
                } else {
                    word.push('$');
                }
                self.i += 1;
            }
        }
        Ok(())
    }

    /// Text up to the `close` that balances an `open` already read; the `close` is consumed.
    fn balanced(&mut self, open: char, close: char) -> Result<String, Unreadable> {
        let mut depth = 0usize;
        let mut inside = String::new();
        loop {
            match self.peek(0) {
                None => return Err(UNMATCHED),
                Some(c) if c == close && depth == 0 => break,
                Some(c) => {
                    if c == open {
                        depth += 1;
                    } else if c == close {
                        depth -= 1;
                    } else if c == '\\' {
                        inside.push(c);
                        self.i += 1;
                        if let Some(e) = self.peek(0) {
                            inside.push(e);
                        }
                        self.i += 1;
                        continue;
                    }
                    inside.push(c);
                    self.i += 1;
                }
            }
        }
        self.i += 1;
        Ok(inside)
    }

    /// Reads the commands of a `$(…)` or `<(…)` whose `(` was just passed.
    fn substitution(&mut self) -> Result<(), Unreadable> {
        if self.depth >= MAX_NESTING {
            return Err(TOO_NESTED);
        }
        self.depth += 1;
        let read = self.list(true, true);
        self.depth -= 1;
        read
    }

    /// Reads a `` `…` `` substitution at `self.i` as a line of its own.
    fn backtick(&mut self, word: &mut Building, quoted: bool) -> Result<(), Unreadable> {
        let mut inner = String::new();
        self.i += 1;
        loop {
            match self.peek(0) {
                None => return Err(OPEN_QUOTE),
                Some('`') => break,
                Some('\\') if matches!(self.peek(1), Some('$' | '`' | '\\')) => {
                    inner.extend(self.peek(1));
                    self.i += 2;
                }
                Some(c) => {
                    inner.push(c);
                    self.i += 1;
                }
            }
        }
        self.i += 1;
        let mut inside = segments_at(&inner, self.typed, self.depth + 1)?;
        for segment in &mut inside {
            segment.substituted = true;
        }
        self.out.append(&mut inside);
        word.expansion(!quoted);
        Ok(())
    }
}

/// Words joined back into a line, as `eval` and `watch` join them.
pub(super) fn words_text(words: &[Word]) -> String {
    words
        .iter()
        .map(|w| w.text.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` single-quoted for a shell.
pub(super) fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// Splits the text of `env -S` the way GNU `env` does: whitespace separates, quotes group,
/// `\_` is a separator outside double quotes and a space inside, `\c` ends the text, `#` at a
/// word's start begins a comment, `${NAME}` is a variable.
pub(super) fn env_split(text: &str) -> Result<Vec<Word>, Unreadable> {
    let mut words = Vec::new();
    let mut word = Building::default();
    let mut chars = text.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, ' ' | '\t' | '\n' | '\r' | '\u{b}' | '\u{c}') => words.extend(word.finish()),
            (None, '#') if !word.started => break,
            (None, '\'' | '"') => {
                word.quoted();
                quote = Some(c);
            }
            (Some(q), c) if c == q => quote = None,
            (q, '\\') => {
                let Some(e) = chars.next() else {
                    return Err(OPEN_QUOTE);
                };
                match (q, e) {
                    (Some('\''), '\\' | '\'') => word.push_quoted(e),
                    (Some('\''), _) => {
                        word.push_quoted('\\');
                        word.push_quoted(e);
                    }
                    (None, '_') => words.extend(word.finish()),
                    (_, '_') => word.push_quoted(' '),
                    (_, 'c') => {
                        if quote.is_some() {
                            return Err(OPEN_QUOTE);
                        }
                        break;
                    }
                    (_, 'f') => word.push_quoted('\u{c}'),
                    (_, 'n') => word.push_quoted('\n'),
                    (_, 'r') => word.push_quoted('\r'),
                    (_, 't') => word.push_quoted('\t'),
                    (_, 'v') => word.push_quoted('\u{b}'),
                    (_, '\\' | '\'' | '"' | '#' | '$' | ' ') => word.push_quoted(e),
                    _ => return Err(Unreadable("an env -S escape the rules do not know")),
                }
            }
            (q, '$') if q != Some('\'') => {
                if chars.peek() != Some(&'{') {
                    return Err(Unreadable("an env -S $ without braces"));
                }
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                }
                word.expansion(q.is_none());
            }
            (Some(_), c) => word.push_quoted(c),
            (None, c) => word.push(c),
        }
    }
    if quote.is_some() {
        return Err(OPEN_QUOTE);
    }
    words.extend(word.finish());
    Ok(words)
}
