// A small Markdown renderer that builds DOM nodes. Every piece of source text becomes a text
// node; raw HTML in the source is shown as the characters it is; links keep only http(s),
// mailto and same-site URLs; images are shown as links, never loaded.
//
// Covered: paragraphs, headings, fenced and indented code, block quotes, ordered and
// unordered lists (nested by indentation), tables, rules; inline code, strong, emphasis,
// strike-through, links, autolinks and bare URLs.

import { h } from './dom.js';

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEADING = /^ {0,3}(#{1,6})(?:\s+(.*?))?\s*#*\s*$/;
const RULE = /^ {0,3}([-*_])(?:\s*\1){2,}\s*$/;
const QUOTE = /^ {0,3}> ?/;
const ITEM = /^( {0,3})([-*+]|\d{1,9}[.)])(\s+|$)(.*)$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const INDENTED_CODE = /^( {4}|\t)/;

/** Renders Markdown source as a fragment of safe DOM nodes. */
export function renderMarkdown(source) {
  const fragment = document.createDocumentFragment();
  blocks(String(source ?? '').replace(/\r\n?/g, '\n').split('\n'), fragment);
  return fragment;
}

/** Whether a link target is safe to follow: http(s), mailto, or this site. */
export function safeUrl(raw) {
  const text = String(raw).trim();
  if (!text) return null;
  let url;
  try {
    url = new URL(text, document.baseURI);
  } catch {
    return null;
  }
  return ['http:', 'https:', 'mailto:'].includes(url.protocol) ? url.href : null;
}

function startsBlock(line, next) {
  return (
    FENCE.test(line) ||
    HEADING.test(line) ||
    RULE.test(line) ||
    QUOTE.test(line) ||
    ITEM.test(line) ||
    (line.includes('|') && next !== undefined && TABLE_RULE.test(next) && next.includes('-'))
  );
}

function blocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) {
      i += 1;
      continue;
    }
    const fence = FENCE.exec(line);
    if (fence) {
      const marker = fence[1];
      const body = [];
      i += 1;
      while (i < lines.length) {
        const closing = lines[i].trim();
        if (closing.startsWith(marker[0].repeat(marker.length)) && /^[`~]+$/.test(closing)) {
          i += 1;
          break;
        }
        body.push(lines[i]);
        i += 1;
      }
      parent.append(codeBlock(body.join('\n'), fence[2]));
      continue;
    }
    if (INDENTED_CODE.test(line)) {
      const body = [];
      while (i < lines.length && (INDENTED_CODE.test(lines[i]) || !lines[i].trim())) {
        body.push(lines[i].replace(INDENTED_CODE, ''));
        i += 1;
      }
      while (body.length && !body[body.length - 1].trim()) body.pop();
      parent.append(codeBlock(body.join('\n'), ''));
      continue;
    }
    const heading = HEADING.exec(line);
    if (heading) {
      parent.append(inline(heading[2] ?? '', h(`h${heading[1].length}`)));
      i += 1;
      continue;
    }
    if (RULE.test(line)) {
      parent.append(h('hr'));
      i += 1;
      continue;
    }
    if (QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && lines[i].trim() && QUOTE.test(lines[i])) {
        inner.push(lines[i].replace(QUOTE, ''));
        i += 1;
      }
      const quote = h('blockquote');
      blocks(inner, quote);
      parent.append(quote);
      continue;
    }
    if (ITEM.test(line)) {
      i = list(lines, i, parent);
      continue;
    }
    if (line.includes('|') && i + 1 < lines.length && TABLE_RULE.test(lines[i + 1]) && lines[i + 1].includes('-')) {
      i = table(lines, i, parent);
      continue;
    }
    const text = [line];
    i += 1;
    while (i < lines.length && lines[i].trim() && !startsBlock(lines[i], lines[i + 1])) {
      text.push(lines[i]);
      i += 1;
    }
    parent.append(inline(text.map((l) => l.trim()).join('\n'), h('p')));
  }
}

function codeBlock(text, language) {
  const code = h('code', { text });
  if (language) code.dataset.language = language;
  return h('pre', { class: 'code' }, code);
}

function list(lines, start, parent) {
  const first = ITEM.exec(lines[start]);
  const ordered = /\d/.test(first[2]);
  const el = ordered ? h('ol') : h('ul');
  if (ordered) {
    const number = parseInt(first[2], 10);
    if (number !== 1) el.setAttribute('start', String(number));
  }
  let i = start;
  let loose = false;
  const items = [];
  while (i < lines.length) {
    const item = ITEM.exec(lines[i]);
    if (!item || /\d/.test(item[2]) !== ordered || item[1].length > first[1].length + 1) break;
    const indent = item[1].length + item[2].length + Math.min(item[3].length || 1, 4);
    const body = [item[4]];
    i += 1;
    while (i < lines.length) {
      const next = lines[i];
      if (!next.trim()) {
        const after = lines[i + 1];
        if (after === undefined) break;
        const sibling = ITEM.exec(after);
        const continues = after.startsWith(' '.repeat(Math.min(indent, 4))) && after.trim();
        if (!continues && !(sibling && /\d/.test(sibling[2]) === ordered)) break;
        loose = true;
        body.push('');
        i += 1;
        continue;
      }
      const leading = next.length - next.trimStart().length;
      if (leading >= Math.min(indent, 2)) {
        body.push(next.slice(Math.min(leading, indent)));
        i += 1;
        continue;
      }
      if (ITEM.test(next) || startsBlock(next, lines[i + 1])) break;
      body.push(next.trim());
      i += 1;
    }
    while (body.length && !body[body.length - 1].trim()) body.pop();
    items.push(body);
  }
  for (const body of items) {
    const li = h('li');
    const simple = !loose && body.every((l) => l.trim() && !startsBlock(l));
    if (simple) inline(body.map((l) => l.trim()).join('\n'), li);
    else {
      blocks(body, li);
      // A tight list keeps its items' text out of paragraphs, nested lists or not.
      if (!loose) for (const p of li.querySelectorAll(':scope > p')) p.replaceWith(...p.childNodes);
    }
    el.append(li);
  }
  parent.append(el);
  return i;
}

function cells(line) {
  let text = line.trim();
  if (text.startsWith('|')) text = text.slice(1);
  if (text.endsWith('|') && !text.endsWith('\\|')) text = text.slice(0, -1);
  const out = [];
  let current = '';
  for (let i = 0; i < text.length; i += 1) {
    if (text[i] === '\\' && text[i + 1] === '|') {
      current += '|';
      i += 1;
    } else if (text[i] === '|') {
      out.push(current.trim());
      current = '';
    } else current += text[i];
  }
  out.push(current.trim());
  return out;
}

function table(lines, start, parent) {
  const head = cells(lines[start]);
  const aligns = cells(lines[start + 1]).map((c) =>
    c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : null,
  );
  const row = (values, tag) =>
    h(
      'tr',
      {},
      head.map((_, k) => {
        const cell = inline(values[k] ?? '', h(tag));
        if (aligns[k]) cell.classList.add(`align-${aligns[k]}`);
        return cell;
      }),
    );
  const body = h('tbody');
  let i = start + 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes('|')) {
    body.append(row(cells(lines[i]), 'td'));
    i += 1;
  }
  parent.append(h('div', { class: 'table-scroll' }, h('table', {}, h('thead', {}, row(head, 'th')), body)));
  return i;
}

const PUNCTUATION = /[!"#$%&'()*+,\-./:;<=>?@[\\\]^_`{|}~]/;
const BARE_URL = /^https?:\/\/[^\s<>"'`]+/;

/** Fills `parent` with the inline content of `text` and returns it. */
function inline(text, parent) {
  let buffer = '';
  const flush = () => {
    if (buffer) parent.append(document.createTextNode(buffer));
    buffer = '';
  };
  let i = 0;
  while (i < text.length) {
    const c = text[i];
    const rest = text.slice(i);
    if (c === '\\' && PUNCTUATION.test(text[i + 1] ?? '')) {
      buffer += text[i + 1];
      i += 2;
      continue;
    }
    if (c === '\n') {
      flush();
      parent.append(h('br'));
      i += 1;
      continue;
    }
    if (c === '`') {
      const ticks = /^`+/.exec(rest)[0];
      const end = text.indexOf(ticks, i + ticks.length);
      if (end > 0) {
        flush();
        let code = text.slice(i + ticks.length, end);
        if (code.startsWith(' ') && code.endsWith(' ') && code.trim()) code = code.slice(1, -1);
        parent.append(h('code', { text: code }));
        i = end + ticks.length;
        continue;
      }
      buffer += ticks;
      i += ticks.length;
      continue;
    }
    const pair = rest.startsWith('**') || rest.startsWith('__') ? rest.slice(0, 2) : rest.startsWith('~~') ? '~~' : null;
    if (pair && !(pair === '__' && /\w/.test(text[i - 1] ?? ''))) {
      const end = text.indexOf(pair, i + 2);
      if (end > i + 2 && text[i + 2] !== ' ') {
        flush();
        const tag = pair === '~~' ? 'del' : 'strong';
        parent.append(inline(text.slice(i + 2, end), h(tag)));
        i = end + 2;
        continue;
      }
    }
    if ((c === '*' || c === '_') && text[i + 1] !== c && text[i + 1] !== ' ' && text[i + 1] !== undefined) {
      const intraword = c === '_' && /\w/.test(text[i - 1] ?? '');
      let end = text.indexOf(c, i + 1);
      while (end > 0 && (text[end + 1] === c || text[end - 1] === c)) end = text.indexOf(c, end + 2);
      if (!intraword && end > i + 1 && text[end - 1] !== ' ' && !(c === '_' && /\w/.test(text[end + 1] ?? ''))) {
        flush();
        parent.append(inline(text.slice(i + 1, end), h('em')));
        i = end + 1;
        continue;
      }
    }
    if (c === '[' || (c === '!' && text[i + 1] === '[')) {
      const link = linkAt(text, c === '!' ? i + 1 : i);
      if (link) {
        flush();
        const href = safeUrl(link.url);
        const label = c === '!' ? link.label || link.url : link.label;
        if (href) {
          const a = h('a', { href, target: '_blank', rel: 'noopener noreferrer nofollow' });
          if (c === '!') a.append(document.createTextNode(`🖼 ${label}`));
          else inline(label, a);
          parent.append(a);
        } else {
          inline(label, parent);
        }
        i = link.end;
        continue;
      }
    }
    if (c === '<') {
      const auto = /^<(https?:\/\/[^\s<>]+|mailto:[^\s<>]+)>/.exec(rest);
      if (auto) {
        flush();
        parent.append(urlLink(auto[1]));
        i += auto[0].length;
        continue;
      }
    }
    if ((c === 'h' || c === 'H') && !/\w/.test(text[i - 1] ?? '')) {
      const bare = BARE_URL.exec(rest);
      if (bare) {
        let url = bare[0];
        while (/[.,;:!?)\]]$/.test(url)) url = url.slice(0, -1);
        flush();
        parent.append(urlLink(url));
        i += url.length;
        continue;
      }
    }
    buffer += c;
    i += 1;
  }
  flush();
  return parent;
}

function urlLink(url) {
  const href = safeUrl(url);
  if (!href) return document.createTextNode(url);
  return h('a', { href, target: '_blank', rel: 'noopener noreferrer nofollow', text: url });
}

/** A `[label](url "title")` starting at `start`, or null. */
function linkAt(text, start) {
  let depth = 0;
  let close = -1;
  for (let k = start; k < text.length; k += 1) {
    if (text[k] === '\\') {
      k += 1;
      continue;
    }
    if (text[k] === '[') depth += 1;
    if (text[k] === ']') {
      depth -= 1;
      if (depth === 0) {
        close = k;
        break;
      }
    }
  }
  if (close < 0 || text[close + 1] !== '(') return null;
  let parens = 0;
  let end = -1;
  for (let k = close + 2; k < text.length; k += 1) {
    if (text[k] === '(') parens += 1;
    if (text[k] === ')') {
      if (parens === 0) {
        end = k;
        break;
      }
      parens -= 1;
    }
  }
  if (end < 0) return null;
  const target = text.slice(close + 2, end).trim();
  const url = target.replace(/^<([^>]*)>/, '$1').split(/\s+"/)[0];
  return { label: text.slice(start + 1, close), url, end: end + 1 };
}
