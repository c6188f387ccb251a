// The live page's labelling view (#/label/NAME): a person labels a model upgrade's graded pairs
// blind, through the labelling API (GET /admin/labels/NAME/next, POST /admin/labels/NAME and
// /undo; docs/grading.md, People check the grader). It shows the conversation and the two
// answers as A and B in the order the API drew, as plain text (textContent only: an answer is
// a model's output and may hold markup), the rubric the grader was given and the progress
// against the candidate's target. It never shows, stores in the DOM or sends anywhere but back
// to the API which answer is whose: the API's `order` stays in this script's memory.
// A labeller token (it may label and nothing else) opens this view and no other.
// Uses app.js's helpers ($, api, apiError, Unauthorized, showLogin): loaded after it.
"use strict";

const LABEL_KEYS = { a: "A", b: "B", t: "tie", s: "skip" };
const LABEL_HISTORY = 50; // pairs labelled in this tab that undo can show again

const labelling = {
  name: null, // the candidate whose pairs are labelled
  pair: null, // the pair shown: {exchange_id, conversation, answer_a, answer_b, order}
  history: [], // the pairs labelled here, newest last (undo shows the undone one again)
  busy: false, // a call is in flight: keys wait for it
  generation: 0, // bumped on every show/hide: answers for an older view are dropped
  shown: 0, // renders so far (data-shown: a client of the page waits for the next one)
};

// The candidate's name when the hash opens the labelling view, else null.
function labelRoute(hash) {
  const match = (hash || "").match(/^#\/label\/(.+)$/);
  return match ? decodeURIComponent(match[1]) : null;
}

function labelPath(suffix) {
  return `/labels/${encodeURIComponent(labelling.name)}${suffix}`;
}

function labelSay(message, isError) {
  $("l-error").textContent = isError ? message : "";
  $("l-message").textContent = isError ? "" : message;
}

function labelMark(state) {
  labelling.shown += 1;
  const view = $("label-view");
  view.dataset.state = state;
  view.dataset.shown = String(labelling.shown);
}

function labelShow(name) {
  labelling.generation += 1;
  labelling.name = name;
  labelling.pair = null;
  labelling.history = [];
  labelling.busy = false;
  $("label-view").hidden = false;
  $("l-name").textContent = name;
  labelSay("", false);
  labelNext();
}

function labelHide() {
  labelling.generation += 1;
  labelling.name = null;
  labelling.pair = null;
  $("label-view").hidden = true;
}

// One call of the labelling API; a 401 sends the tab back to the token prompt.
async function labelCall(method, suffix, body) {
  const generation = labelling.generation;
  labelling.busy = true;
  try {
    const res = await api(method, labelPath(suffix), body);
    return generation === labelling.generation ? res : null;
  } catch (err) {
    if (err instanceof Unauthorized) showLogin("The admin API refused the token (401). Type it again.");
    else if (generation === labelling.generation) {
      labelSay(`The labelling API did not answer: ${err.message || err}`, true);
      labelMark("error");
    }
    return null;
  } finally {
    if (generation === labelling.generation) labelling.busy = false;
  }
}

async function labelNext(again) {
  const res = await labelCall("GET", "/next");
  if (!res) return;
  if (res.status !== 200) {
    labelRefused(res);
    return;
  }
  labelRender(res.data, again);
}

// The API's refusal, as it says it (409: the gateway keeps no text; 404: no such candidate;
// 403: the token may not label): nothing to label is shown.
function labelRefused(res) {
  $("l-pair").hidden = true;
  $("l-none").hidden = true;
  labelButtons(false);
  labelSay(apiError(res), true);
  labelMark("refused");
}

function labelButtons(enabled) {
  for (const id of ["l-a", "l-b", "l-tie", "l-skip"]) $(id).disabled = !enabled;
}

function labelRender(data, again) {
  const pair = again || data.pair;
  labelling.pair = pair || null;
  $("l-rubric").textContent = data.rubric || "";
  labelProgress(data.progress, data.target);
  $("l-pair").hidden = !pair;
  $("l-none").hidden = Boolean(pair);
  labelButtons(Boolean(pair));
  if (pair) {
    $("l-conversation").textContent = pair.conversation;
    $("l-answer-a").textContent = pair.answer_a;
    $("l-answer-b").textContent = pair.answer_b;
  }
  labelMark(pair ? "pair" : "done");
}

function labelProgress(p, target) {
  if (!p) return;
  const labelled = `${fmt(p.labelled_pairs)} pairs labelled`;
  const goal = num(target) === null
    ? `${labelled} (no target set: min_labels)`
    : `${labelled} of the target ${fmt(target)} (${pct(Math.min(1, p.labelled_pairs / target))})`;
  $("l-progress").textContent =
    `${goal} · ${fmt(p.kept)} pairs kept for people · ${fmt(p.skips)} skipped · yours: ${fmt(p.mine)}`;
}

async function labelAnswer(answer) {
  const pair = labelling.pair;
  if (!pair || labelling.busy) return;
  const body = { exchange_id: pair.exchange_id, order: pair.order, answer };
  const res = await labelCall("POST", "", body);
  if (!res) return;
  if (res.status !== 201) {
    // A pair gone meanwhile (retention, a deleted candidate) or labelled already: say why,
    // then offer the next one (the refusal lost nothing).
    labelSay(apiError(res), true);
    if (res.status === 404 && res.data?.error?.field === "candidate") {
      labelRefused(res);
      return;
    }
  } else {
    labelling.history.push(pair);
    if (labelling.history.length > LABEL_HISTORY) labelling.history.shift();
    labelSay(answer === "skip" ? "Skipped." : `Stored: ${answer === "tie" ? "tie" : answer}.`, false);
  }
  await labelNext();
}

async function labelUndo() {
  if (labelling.busy || !labelling.name) return;
  const res = await labelCall("POST", "/undo");
  if (!res) return;
  if (res.status !== 200) {
    labelSay(apiError(res), true);
    labelMark(labelling.pair ? "pair" : "done");
    return;
  }
  // The undone pair again, as it was shown, when this tab labelled it; else the next one.
  const i = labelling.history.findIndex((p) => p.exchange_id === res.data.undone);
  const again = i >= 0 ? labelling.history.splice(i, 1)[0] : null;
  labelSay("Your last label is undone: label this pair again.", false);
  await labelNext(again);
}

function labelKey(e) {
  if ($("label-view").hidden || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.target instanceof HTMLInputElement || e.target instanceof HTMLTextAreaElement) return;
  const key = e.key.toLowerCase();
  if (key === "u") {
    e.preventDefault();
    labelUndo();
  } else if (LABEL_KEYS[key]) {
    e.preventDefault();
    labelAnswer(LABEL_KEYS[key]);
  }
}

// The detail view links to the labelling view of the candidate it shows.
function labelLink() {
  const match = location.hash.match(/^#\/c\/(.+)$/);
  if (match) $("d-label").href = `#/label/${match[1]}`;
}

document.addEventListener("DOMContentLoaded", () => {
  $("l-a").addEventListener("click", () => labelAnswer("A"));
  $("l-b").addEventListener("click", () => labelAnswer("B"));
  $("l-tie").addEventListener("click", () => labelAnswer("tie"));
  $("l-skip").addEventListener("click", () => labelAnswer("skip"));
  $("l-undo").addEventListener("click", () => labelUndo());
  document.addEventListener("keydown", labelKey);
  window.addEventListener("hashchange", labelLink);
  labelLink();
});
