// Reading a turn's unified diff (`turn/diff.diff`) file by file, and showing one file's part
// as a <pre> with added and removed lines coloured. Lines go in as text, never as markup.

import { h } from './dom.js';

/** How the server names a binary file it does not diff: "Binary file <path> <change>". */
const BINARY = /^Binary file (.*) (added|modified|deleted)$/;
/** The line the server appends when it cut the diff at its size limit. */
const CUT = /^\[diff cut: .*\]$/;
/** A hunk header: `@@ -start[,count] +start[,count] @@`. */
const HUNK = /^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@/;

/** The path a `--- ` / `+++ ` header names, without its `a/` / `b/` prefix; null for /dev/null. */
function headerPath(line) {
  const name = line.slice(4).split('\t')[0];
  if (name === '/dev/null') return null;
  return name.startsWith('a/') || name.startsWith('b/') ? name.slice(2) : name;
}

/**
 * Splits a unified diff into each file's lines, by path, and says whether the server cut it.
 * Hunk lengths are counted, so a removed line that reads "-- x" (shown as "--- x") is taken
 * as content, not as the next file's header.
 */
export function splitDiff(text) {
  const sections = new Map();
  let lines = null;
  let oldLeft = 0;
  let newLeft = 0;
  let cut = false;
  const all = String(text ?? '').split('\n');
  if (all[all.length - 1] === '') all.pop();
  for (let i = 0; i < all.length; i += 1) {
    const line = all[i];
    const inHunk = oldLeft > 0 || newLeft > 0;
    if (inHunk && /^[ +\\-]/.test(line)) {
      if (line.startsWith(' ')) {
        oldLeft -= 1;
        newLeft -= 1;
      } else if (line.startsWith('-')) oldLeft -= 1;
      else if (line.startsWith('+')) newLeft -= 1;
      lines.push(line);
      continue;
    }
    // Anything else ends the hunk: the cut note, or the blank line before it.
    oldLeft = 0;
    newLeft = 0;
    const binary = BINARY.exec(line);
    if (binary) {
      lines = [line];
      sections.set(binary[1], lines);
      continue;
    }
    if (line.startsWith('--- ') && all[i + 1]?.startsWith('+++ ')) {
      const path = headerPath(all[i + 1]) ?? headerPath(line);
      lines = [line, all[i + 1]];
      i += 1;
      if (path !== null) sections.set(path, lines);
      continue;
    }
    if (CUT.test(line.trim())) {
      cut = true;
      lines?.push(line);
      continue;
    }
    const hunk = HUNK.exec(line);
    if (hunk && lines) {
      oldLeft = hunk[1] === undefined ? 1 : Number(hunk[1]);
      newLeft = hunk[2] === undefined ? 1 : Number(hunk[2]);
    }
    lines?.push(line);
  }
  return { sections, cut };
}

/** The class of a diff line, by its first character (headers first: they start with +/- too). */
function lineClass(line, index) {
  if (index < 2 && (line.startsWith('--- ') || line.startsWith('+++ '))) return 'diff-meta';
  if (line.startsWith('Binary file') || CUT.test(line.trim())) return 'diff-meta';
  if (line.startsWith('@@')) return 'diff-hunk';
  if (line.startsWith('+')) return 'diff-add';
  if (line.startsWith('-')) return 'diff-del';
  return 'diff-context';
}

/** One file's part of the diff, a line per span; `lines` null when the diff has no part for it. */
export function diffView(path, lines, cut) {
  const pre = h('pre', { class: 'diff-view', testid: 'turn-diff-view', dataset: { path } });
  if (!lines) {
    pre.classList.add('empty');
    pre.textContent = cut
      ? 'Not shown: the diff was cut at its size limit before this file.'
      : 'No text diff for this file.';
    return pre;
  }
  pre.append(...lines.map((line, index) => h('span', { class: lineClass(line, index), text: `${line}\n` })));
  return pre;
}
