// Writes models/data/testdata/gpt2_bpe_cases.json: texts and the ids OpenAI's
// tiktoken (npm "tiktoken", the Rust library built to WebAssembly; encoding
// "gpt2", which is GPT-2's byte-level BPE) gives them, for
// //models/data:gpt2_bpe_test. Not run by the build; to regenerate:
//
//   cd /tmp && npm install tiktoken
//   NODE_PATH=/tmp/node_modules node models/data/testdata/gpt2_bpe_reference.js \
//       models/data/text/newton_opticks.txt > models/data/testdata/gpt2_bpe_cases.json
const fs = require('fs');
const {get_encoding} = require('tiktoken');
const enc = get_encoding('gpt2');
const ids = (text) => Array.from(enc.encode_ordinary(text));

// Edge cases of the pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
const cases = [
  'Hello world',
  'I\'m here, you\'re there; we\'ve been, they\'ll go, he\'d say \'tis',
  'DON\'T SHOUT\'S \'S \'LL \'\'s \'\'\'re rock\'n\'roll \'x \'',
  'a  b   c    d\te\t\tf',
  'trailing spaces   ',
  '   leading spaces',
  'lines\n\nand\r\nmore\n \n  \n\t\nend\n',
  ' \n',
  '\n',
  '',
  ' ',
  '  ',
  'x \u00a0 y\u3000z\u2028w\u2029v\u0085u\u1680t\u202fs\u205fr\u2003q',
  'bom\ufeffhere and\u000b\u000cvtab',
  '1234567890 3.14159 -42 1e10 0x1F 1,000,000 ٣٤٥ Ⅻ ½ ² ³⁄₄',
  'Ελληνικά кириллица 日本語のテキスト 한국어 עברית العربية हिन्दी ไทย',
  'café naïve façade Ångström résumé\u0301 e\u0301',
  'emoji 😀👍🏽 👨\u200d👩\u200d👧 ❤\ufe0f 🇫🇷 ok',
  '<|endoftext|> is literal text here',
  'int main() { return x->y[i] * 2 + (a && b) ? "s" : \'c\'; }',
  'https://example.com/path?q=1&r=2#frag user@example.org',
  '...!!!???;;;:::---___***###@@@$$$%%%^^^&&&',
  '\u0000\u0001\u001f\u007f control',
  'Mr. O\'Neil\'s dog\'s bone—“quoted” ‘single’ «guillemets»',
  '    def f(x):\n        return x  # comment\n',
];

// Random strings over pieces from long-stable Unicode blocks.
const pieces = [
  'a',      'Z',      'q',      'é',        'ß',      'Ω',      'ж',
  '日',     '本',     '한',     'ا',        'अ',      '\u093f', '\u0301',
  '0',      '7',      '42',     '٣',        'Ⅻ',      '½',      '²',
  ' ',      '  ',     '\t',     '\n',       '\r\n',   '\u00a0', '\u3000',
  '\u2028', '\u0085', '\ufeff', '\'',       '\'s',    '\'ll',   '\'re',
  '\'S',    '\'d',    '.',      ',',        '!',      '?',      '-',
  '—',      '€',      '😀',      '👍🏽', '\u200d', '\ufe0f', '<|endoftext|>',
  '_',      '@',      '#',      '\u0007',   'the',    ' the',   'ing',
  'tion',   'Newton', ' of',    'http'
];
let state = 12345;
const next = () => {
  state = (state * 1103515245 + 12345) % 2147483648;
  return state;
};
for (let n = 0; n < 400; n++) {
  let s = '';
  const len = 1 + next() % 24;
  for (let k = 0; k < len; k++) s += pieces[next() % pieces.length];
  cases.push(s);
}

// Prose: the shipped text's opening and, as count and hash only, all of it.
const text = fs.readFileSync(process.argv[2], 'utf-8');
const opening = text.slice(0, text.indexOf('\n', 4000) + 1);
cases.push(opening);
const all = ids(text);
let hash = 0xcbf29ce484222325n;  // FNV-1a 64 over the ids as little-endian uint32
for (const id of all) {
  for (let b = 0; b < 4; b++) {
    hash ^= BigInt((id >>> (8 * b)) & 0xff);
    hash = (hash * 0x100000001b3n) & 0xffffffffffffffffn;
  }
}

// With special tokens allowed (tiktoken's encode(text, 'all')): "<|endoftext|>"
// in the text is id 50256 and the text around it is encoded piece by piece.
const special = [
  'one story.<|endoftext|>Another story.',
  '<|endoftext|>',
  '<|endoftext|><|endoftext|>',
  'a <|endoftext|> b',
  'end\n<|endoftext|>\n  start',
  '<|endoftext|x <|endoftext <|endoftext|>|> <|endoftext|>>',
  'no special token here',
];

const out = {
  generator: 'tiktoken (npm) ' +
      JSON.parse(fs.readFileSync(require.resolve('tiktoken').replace(/[^/]*$/, 'package.json')))
          .version +
      ', encoding gpt2',
  cases: cases.map((t) => ({text: t, ids: ids(t)})),
  special_cases: special.map((t) => ({text: t, ids: Array.from(enc.encode(t, 'all'))})),
  shipped_text: {num_tokens: all.length, fnv1a64: '0x' + hash.toString(16).padStart(16, '0')},
};
process.stdout.write(JSON.stringify(out, null, 0).replace(/\},\{"text"/g, '},\n{"text"') + '\n');
