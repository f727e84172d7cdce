/* Helpers shared by the page scripts: translated strings, sizes, the CSRF token, dialogs.
 *
 * An ES module: the page scripts import what they use, so nothing depends on the order in
 * which the page loads them.
 */

const stringsNode = document.getElementById("js-strings");
const strings = stringsNode ? JSON.parse(stringsNode.textContent) : {};
const csrfMeta = document.querySelector('meta[name="csrf-token"]');

/** The page's CSRF token, for requests that change data. */
export const csrfToken = csrfMeta ? csrfMeta.getAttribute("content") : "";

/** A name as the pages show it: controls, line separators and bidi marks escaped (the
 * server's `visible` filter), so it keeps one line and displays in its real order. */
export function visible(text) {
  var pattern = /[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;
  var short = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };
  return String(text).replace(pattern, function (char) {
    if (short[char]) {
      return short[char];
    }
    var code = char.charCodeAt(0);
    return code < 0x100
      ? "\\x" + ("0" + code.toString(16)).slice(-2)
      : "\\u" + ("000" + code.toString(16)).slice(-4);
  });
}

/**
 * Headers that let the page change things through the JSON API: the form token and, with
 * accounts on, the `csrf_token` cookie echoed in X-CSRF-Token (read on every call, because
 * the server may renew it).
 */
export function csrfHeaders() {
  // X-DeerFlow-Page: the answer's `detail` is read by a person, in the page's language.
  var headers = { "X-CSRFToken": csrfToken, "X-DeerFlow-Page": "1" };
  var match = document.cookie.match(/(?:^|;\s*)csrf_token=([^;]*)/);
  if (match) {
    headers["X-CSRF-Token"] = decodeURIComponent(match[1]);
  }
  return headers;
}

/** Set `csrfHeaders()` on a request that takes one header at a time (XHR, tus-js-client). */
export function setCsrfHeaders(setHeader) {
  var headers = csrfHeaders();
  Object.keys(headers).forEach(function (name) {
    setHeader(name, headers[name]);
  });
}

/** A translated string with {placeholders} filled in. */
export function t(key, params) {
  var text = strings[key] || key;
  Object.keys(params || {}).forEach(function (name) {
    text = text.split("{" + name + "}").join(String(params[name]));
  });
  return text;
}

/** Sizes exactly as the server writes them (SPEC 2.7): B, then KiB/MiB/GiB, one decimal. */
export function formatSize(size) {
  if (size < 1024) {
    return size + " B";
  }
  var units = ["KiB", "MiB", "GiB"];
  var value = size / 1024;
  var index = 0;
  while (value >= 1024 && index < units.length - 1) {
    value /= 1024;
    index += 1;
  }
  var text = value.toFixed(1);
  if (text.slice(-2) === ".0") {
    text = text.slice(0, -2);
  }
  return text + " " + units[index];
}

/**
 * The page's sentence for each failure a person can act on, by HTTP status (0: no answer
 * came back). The API's `detail` is written for a developer calling it ("send the
 * csrf_token cookie's value in X-CSRF-Token"); a person reads these instead, translated
 * by the page (thread_files.html). With accounts on, a 403 from the API means the page's
 * CSRF token no longer matches the session; single-user, the page names another cause.
 */
var PROBLEM_BY_STATUS = {
  0: "networkError",
  401: "errorSignedOut",
  403: "errorForbidden",
  409: "errorConflict",
  413: "errorTooLarge",
  429: "errorBusy",
  500: "errorServer",
  502: "errorUnavailable",
  503: "errorUnavailable",
  507: "errorStorage",
};

/**
 * What to tell a person about a failed request: the page's sentence for the status, or,
 * for a refusal about this very file (a bad name, a failed conversion), the server's
 * explanation, or the status as a last resort.
 */
export function problemOf(status, body) {
  var key = PROBLEM_BY_STATUS[status];
  if (key) {
    return t(key);
  }
  return detailOf(body, t("errorStatus", { status: status }));
}

/** The message of an API error body (`detail` as text, or the first of a list). */
export function detailOf(body, fallback) {
  if (body && typeof body.detail === "string") {
    return body.detail;
  }
  if (body && Array.isArray(body.detail) && body.detail.length && body.detail[0].msg) {
    return body.detail[0].msg;
  }
  return fallback;
}

/** Open a modal dialog; resolve with whether it was closed with the "confirm" value. */
export function showDialog(dialog) {
  return new Promise(function (resolve) {
    dialog.addEventListener(
      "close",
      function () {
        resolve(dialog.returnValue === "confirm");
      },
      { once: true }
    );
    dialog.returnValue = "";
    dialog.showModal();
  });
}
