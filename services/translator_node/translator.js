'use strict';
// The translator agent: deterministic, no model. It translates English text word by
// word from a small built-in glossary (into French, German or Spanish):
//
//   step 1      the `lookup` tool looks every distinct word up in the glossary;
//   steps 2..n  `words_per_step` words per step, one `text_delta` per translated word;
//   then        `output` and `completed`, with the translation and the words not found.
//
// A run is a pure function of its input and the step it resumes at, so a restarted
// process continues from its last completed step (see server.js).

const AGENT_TYPE = 'translator-node';

const DESCRIPTION =
  'Translates English text word by word from a built-in glossary (fr, de, es); ' +
  'words it does not know are kept as they are and listed in `unknown`.';

const TARGETS = ['fr', 'de', 'es'];

const INPUT_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  title: 'TranslateInput',
  description: 'The text to translate.',
  type: 'object',
  properties: {
    text: {
      type: 'string',
      minLength: 1,
      maxLength: 10000,
      description: 'English text; words are separated by whitespace.',
    },
    target: {
      type: 'string',
      enum: TARGETS,
      default: 'fr',
      description: 'The language to translate into.',
    },
    words_per_step: {
      type: 'integer',
      minimum: 1,
      maximum: 50,
      default: 4,
      description: 'Words translated per step (a step is the unit a restart resumes from).',
    },
  },
  required: ['text'],
  additionalProperties: false,
};

const OUTPUT_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  title: 'Translation',
  type: 'object',
  properties: {
    translation: { type: 'string', description: 'The translated text.' },
    target: { type: 'string', enum: TARGETS, description: 'The language translated into.' },
    words: { type: 'integer', minimum: 0, description: 'Words in the original text.' },
    unknown: {
      type: 'array',
      items: { type: 'string' },
      description: 'Distinct words (lower-cased) the glossary does not have, in order of appearance.',
    },
  },
  required: ['translation', 'target', 'words', 'unknown'],
  additionalProperties: false,
};

const TOOL_NAMES = ['lookup'];

// english: [fr, de, es]
const GLOSSARY = {
  a: ['un', 'ein', 'un'],
  after: ['après', 'nach', 'después'],
  agent: ['agent', 'Agent', 'agente'],
  agents: ['agents', 'Agenten', 'agentes'],
  all: ['tout', 'alle', 'todo'],
  and: ['et', 'und', 'y'],
  are: ['sont', 'sind', 'son'],
  book: ['livre', 'Buch', 'libro'],
  cat: ['chat', 'Katze', 'gato'],
  crash: ['panne', 'Absturz', 'fallo'],
  day: ['jour', 'Tag', 'día'],
  each: ['chaque', 'jeder', 'cada'],
  event: ['événement', 'Ereignis', 'evento'],
  events: ['événements', 'Ereignisse', 'eventos'],
  every: ['chaque', 'jedes', 'cada'],
  good: ['bon', 'gut', 'bueno'],
  hello: ['bonjour', 'hallo', 'hola'],
  in: ['dans', 'in', 'en'],
  is: ['est', 'ist', 'es'],
  language: ['langue', 'Sprache', 'idioma'],
  log: ['journal', 'Protokoll', 'registro'],
  lost: ['perdu', 'verloren', 'perdido'],
  mesh: ['maillage', 'Netz', 'malla'],
  message: ['message', 'Nachricht', 'mensaje'],
  new: ['nouveau', 'neu', 'nuevo'],
  night: ['nuit', 'Nacht', 'noche'],
  no: ['non', 'nein', 'no'],
  nothing: ['rien', 'nichts', 'nada'],
  of: ['de', 'von', 'de'],
  old: ['vieux', 'alt', 'viejo'],
  once: ['une fois', 'einmal', 'una vez'],
  one: ['un', 'eins', 'uno'],
  other: ['autre', 'andere', 'otro'],
  reads: ['lit', 'liest', 'lee'],
  resumes: ['reprend', 'setzt fort', 'reanuda'],
  service: ['service', 'Dienst', 'servicio'],
  session: ['session', 'Sitzung', 'sesión'],
  small: ['petit', 'klein', 'pequeño'],
  speaks: ['parle', 'spricht', 'habla'],
  stream: ['flux', 'Strom', 'flujo'],
  text: ['texte', 'Text', 'texto'],
  the: ['le', 'der', 'el'],
  three: ['trois', 'drei', 'tres'],
  to: ['à', 'zu', 'a'],
  two: ['deux', 'zwei', 'dos'],
  water: ['eau', 'Wasser', 'agua'],
  with: ['avec', 'mit', 'con'],
  word: ['mot', 'Wort', 'palabra'],
  words: ['mots', 'Wörter', 'palabras'],
  world: ['monde', 'Welt', 'mundo'],
  writes: ['écrit', 'schreibt', 'escribe'],
};

// A key of the caller's input is cut to this many characters in an error's field path
// (as the Python services do): the path travels back in the status trailer.
const MAX_PATH_PART = 64;

class InvalidInput extends Error {
  /** @param {string} field @param {string} problem */
  constructor(field, problem) {
    super(`${field}: ${problem}`);
    this.field = field;
    this.problem = problem;
  }
}

/**
 * The input, parsed and validated against INPUT_SCHEMA, with defaults applied.
 * Errors name the field the way the Python services do (`input_json.text: Field required`).
 * @param {string} inputJson
 */
function parseInput(inputJson) {
  let value;
  try {
    value = JSON.parse(inputJson === '' ? '{}' : inputJson);
  } catch (err) {
    throw new InvalidInput('input_json', `not valid JSON (${err instanceof Error ? err.message : err})`);
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new InvalidInput('input_json', 'Input should be an object');
  }
  // Own keys only: `in` also finds what every object inherits (`constructor`, `toString`).
  const has = (object, key) => Object.prototype.hasOwnProperty.call(object, key);
  for (const key of Object.keys(value)) {
    if (!has(INPUT_SCHEMA.properties, key)) {
      const shown = key.length <= MAX_PATH_PART ? key : `${key.slice(0, MAX_PATH_PART - 1)}…`;
      throw new InvalidInput(`input_json.${shown}`, 'Extra inputs are not permitted');
    }
  }
  if (!has(value, 'text')) throw new InvalidInput('input_json.text', 'Field required');
  if (typeof value.text !== 'string') {
    throw new InvalidInput('input_json.text', 'Input should be a valid string');
  }
  if (value.text.length < 1) {
    throw new InvalidInput('input_json.text', 'String should have at least 1 character');
  }
  // JSON Schema's maxLength counts characters (code points), not UTF-16 code units.
  if (value.text.length > 10000 && [...value.text].length > 10000) {
    throw new InvalidInput('input_json.text', 'String should have at most 10000 characters');
  }
  const target = value.target === undefined ? 'fr' : value.target;
  if (!TARGETS.includes(target)) {
    throw new InvalidInput('input_json.target', `Input should be ${TARGETS.map((t) => `'${t}'`).join(', ')}`);
  }
  const perStep = value.words_per_step === undefined ? 4 : value.words_per_step;
  if (!Number.isInteger(perStep) || perStep < 1 || perStep > 50) {
    throw new InvalidInput('input_json.words_per_step', 'Input should be an integer from 1 to 50');
  }
  return { text: value.text, target, words_per_step: perStep };
}

const WORD = /^([^\p{L}\p{N}]*)([\p{L}\p{N}'-]*?)([^\p{L}\p{N}]*)$/u;

/** The text split on whitespace: [{raw, lead, core, trail}] */
function tokenize(text) {
  return text
    .split(/\s+/u)
    .filter(Boolean)
    .map((raw) => {
      const m = WORD.exec(raw);
      return m ? { raw, lead: m[1], core: m[2], trail: m[3] } : { raw, lead: '', core: raw, trail: '' };
    });
}

/** The glossary entries for the distinct words of `text`, as the `lookup` tool returns them. */
function lookup(words, target) {
  const column = TARGETS.indexOf(target);
  const found = {};
  const missing = [];
  for (const word of words) {
    const entry = Object.prototype.hasOwnProperty.call(GLOSSARY, word) ? GLOSSARY[word] : undefined;
    if (entry) found[word] = entry[column];
    else missing.push(word);
  }
  return { found, missing };
}

function translateToken(token, found) {
  const key = token.core.toLowerCase();
  let out = Object.prototype.hasOwnProperty.call(found, key) ? found[key] : token.core;
  if (out !== token.core && token.core && token.core[0] !== token.core[0].toLowerCase()) {
    out = out[0].toUpperCase() + out.slice(1); // keep a capital letter
  }
  return token.lead + out + token.trail;
}

/**
 * The plan of a run: what every step does. Deterministic in `input`, so a resumed
 * run recomputes it and continues at any step.
 */
function plan(input) {
  const tokens = tokenize(input.text);
  const distinct = [...new Set(tokens.map((t) => t.core.toLowerCase()).filter(Boolean))];
  const lookedUp = lookup(distinct, input.target);
  const translated = tokens.map((t) => translateToken(t, lookedUp.found));
  const chunks = [];
  for (let i = 0; i < translated.length; i += input.words_per_step) {
    chunks.push(translated.slice(i, i + input.words_per_step).map((w, j) => (i + j === translated.length - 1 ? w : `${w} `)));
  }
  return {
    lookup: {
      tool_call_id: 'call_1_0',
      tool_name: 'lookup',
      arguments: { words: distinct, target: input.target },
      result: lookedUp,
    },
    // chunks[k] is step k + 2: its words, as text deltas.
    chunks,
    output: {
      translation: translated.join(' '),
      target: input.target,
      words: tokens.length,
      unknown: lookedUp.missing,
    },
  };
}

module.exports = {
  AGENT_TYPE,
  DESCRIPTION,
  INPUT_SCHEMA,
  OUTPUT_SCHEMA,
  TOOL_NAMES,
  InvalidInput,
  parseInput,
  plan,
};
