// A small Markdown renderer for replies: the text is escaped first, so a reply can only ever
// produce the markup made here (code blocks, inline code, bold, italics, headings, lists, links to
// http(s) addresses, paragraphs).
"use strict";

function escapeHtml(text) {
  return text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function renderInline(text) {
  return escapeHtml(text)
    .replace(/`([^`]+)`/g, "<code>$1</code>")
    .replace(/\*\*([^*]+)\*\*/g, "<strong>$1</strong>")
    .replace(/(^|[^*])\*([^*\s][^*]*)\*/g, "$1<em>$2</em>")
    .replace(/\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g, '<a href="$2" rel="noopener noreferrer" target="_blank">$1</a>');
}

function renderMarkdown(text) {
  const out = [];
  const blocks = text.split(/(```[^\n]*\n[\s\S]*?(?:```|$))/);
  for (const block of blocks) {
    if (block.startsWith("```")) {
      const body = block.replace(/^```[^\n]*\n/, "").replace(/```$/, "");
      out.push("<pre><code>" + escapeHtml(body) + "</code></pre>");
      continue;
    }
    for (const para of block.split(/\n{2,}/)) {
      if (!para.trim()) continue;
      const lines = para.split("\n");
      const heading = /^(#{1,6})\s+(.*)$/.exec(lines[0]);
      if (heading && lines.length === 1) {
        out.push(`<h${heading[1].length}>${renderInline(heading[2])}</h${heading[1].length}>`);
      } else if (lines.every((l) => /^\s*[-*]\s+/.test(l))) {
        out.push("<ul>" + lines.map((l) => "<li>" + renderInline(l.replace(/^\s*[-*]\s+/, "")) + "</li>").join("") + "</ul>");
      } else if (lines.every((l) => /^\s*\d+\.\s+/.test(l))) {
        out.push("<ol>" + lines.map((l) => "<li>" + renderInline(l.replace(/^\s*\d+\.\s+/, "")) + "</li>").join("") + "</ol>");
      } else {
        out.push("<p>" + lines.map(renderInline).join("<br>") + "</p>");
      }
    }
  }
  return out.join("");
}
