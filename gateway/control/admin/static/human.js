// The live page's "what people prefer" table, in a model upgrade's LLM grader panel: the report's
// `human_preference` metric (evaluators/human/metric.py; docs/grading.md, People check the
// grader) as the text and HTML reports write it (evaluators/human/render.py): people's net
// preference, prediction-powered (PPI++), beside people's labels alone and the grader alone, each
// with its always-valid interval and n, and which one gates; the grader's agreement with people
// (a confusion matrix with ties, Cohen's κ), people's agreement with each other, the labels,
// skips and the labelled-through point, and the grader's worth in labels. Nothing for a
// candidate without labels. Plain text only (textContent through app.js's `el`).
// Uses app.js's helpers ($, el, num, fmt, pct, fill, row): loaded after it.
"use strict";

const HUMAN_METRIC = "human_preference";
// Rows (the grader) and columns (people) of the confusion matrix, in the report's order
// (evaluators.human.agreement.CATEGORIES).
const HUMAN_CATEGORIES = ["candidate", "tie", "reference"];
const INSUFFICIENT = "insufficient data";

// A net preference in percentage points, signed, as the reports write it ("+4.2 pp").
function humanPp(v) {
  const x = num(v);
  if (x === null) return "–";
  const s = (100 * x).toFixed(1);
  return `${s.startsWith("-") ? s : `+${s}`} pp`;
}

function humanHead(...names) {
  return el("thead", {}, el("tr", {}, ...names.map((n) => el("th", {}, n))));
}

// The section, made once inside the grader panel, after the grader's own table.
function humanSection() {
  const found = $("d-human");
  if (found) return found;
  const section = el(
    "section",
    { id: "d-human", "aria-labelledby": "d-human-title" },
    el("h4", { id: "d-human-title" }, "What people prefer (people's labels check the grader)"),
    el("p", { id: "d-human-source" }),
    el(
      "table",
      { id: "d-human-estimates" },
      humanHead("estimate", "net preference", "interval (always-valid)", "n", "gates"),
      el("tbody"),
    ),
    el("table", { id: "d-human-facts" }, humanHead("fact", "value"), el("tbody")),
    el("h4", {}, "Grader vs people (confusion matrix with ties, pairs)"),
    el(
      "table",
      { id: "d-human-confusion" },
      humanHead("", ...HUMAN_CATEGORIES.map((p) => `people: ${p}`)),
      el("tbody"),
    ),
  );
  $("d-grader").after(section);
  return section;
}

// One estimate's row: "insufficient data" where the report has no estimate.
function humanEstimate(d, name, key, n, gates) {
  const est = num(d[`${key}_estimate`]);
  return row([
    name,
    est === null ? INSUFFICIENT : humanPp(est),
    est === null ? "–" : `[${humanPp(d[`${key}_low`])}, ${humanPp(d[`${key}_high`])}]`,
    n,
    gates ? "gates" : "shown, not gating",
  ], { "data-estimate": key });
}

// Cohen's κ, the agreement share and n, or `none` when nothing was compared.
function humanAgreement(kappa, share, n, what, none) {
  if (!num(n)) return none;
  const k = num(kappa);
  return `Cohen's κ ${k === null ? "–" : k.toFixed(2)}, agreement ${pct(share)}, n=${fmt(n)} ${what}`;
}

function humanFacts(m, d) {
  const through = d.labelled_through_units;
  const worth = num(d.grader_worth_labels);
  const lambda = num(d.ppi_lambda);
  const rows = [
    ["labels / skipped / waiting", `${fmt(d.labels)} / ${fmt(d.label_skips)} / ${fmt(d.labels_waiting)}` +
      ` (skip share ${pct(d.label_skip_share)})`],
    ["labelled through", `${fmt(through)} of ${fmt(d.graded_units)} graded units (${fmt(d.chosen_units)} chosen` +
      ` for people at label_rate ${pct(d.label_rate)})`],
    ["the grader's worth", worth === null ? INSUFFICIENT
      : `its ${fmt(through)} verdicts were worth ${fmt(Math.round(worth))} labels here` +
        ` (λ = ${lambda === null ? "–" : lambda.toFixed(2)})`],
    ["grader vs people", humanAgreement(d.kappa, d.agreement_share, d.agreement_n, "pairs",
      "no labelled pair yet")],
    ["people vs people", humanAgreement(d.people_kappa, d.people_agreement_share, d.people_n,
      "double-labelled pairs", "no double-labelled pairs yet")],
  ];
  if (m.ungated) rows.push(["not gating", m.ungated]);
  else if (m.reason) rows.push([m.status === "info" ? INSUFFICIENT : `status: ${m.status}`, m.reason]);
  return rows.map(([k, v]) => row([k, v]));
}

// Called by app.js's renderGrader with the report's metrics.
function renderHuman(metrics) {
  const m = metrics[HUMAN_METRIC];
  const d = (m && m.detail) || {};
  const labelled = [d.labels, d.label_skips, d.agreement_n].some((v) => num(v) > 0);
  if (!labelled) {
    if ($("d-human")) $("d-human").hidden = true;
    return;
  }
  const section = humanSection();
  section.hidden = false;
  const people = d.preference_source === "human";
  $("d-human-source").textContent = people
    ? `People's prediction-powered estimate gates (preference_source = human, from min_labels ` +
      `${fmt(d.min_labels)} labels on): status ${m.status}.`
    : "The grader's net preference gates (preference_source = grader); people's estimates are " +
      "shown beside it and decide nothing.";
  const labels = `${fmt(d.labels)} labels`;
  const units = (n) => `${fmt(n)} graded units`;
  fill($("d-human-estimates").tBodies[0], [
    humanEstimate(d, "people, prediction-powered (PPI++)", "ppi",
      `${labels} / ${units(d.labelled_through_units)}`, people),
    humanEstimate(d, "people's labels alone", "human", labels, false),
    humanEstimate(d, "the grader alone", "grader", units(d.grader_units), !people),
  ]);
  fill($("d-human-facts").tBodies[0], humanFacts(m, d));
  fill(
    $("d-human-confusion").tBodies[0],
    HUMAN_CATEGORIES.map((g) =>
      row(
        [
          `grader: ${g}`,
          ...HUMAN_CATEGORIES.map((p) =>
            el("td", { "data-people": p }, fmt(d[`confusion_grader_${g}_people_${p}`])),
          ),
        ],
        { "data-grader": g },
      ),
    ),
  );
}
