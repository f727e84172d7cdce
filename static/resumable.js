/* Large files through the resumable (tus) API, with tus-js-client (static/vendor/).
 *
 * A file above the server's `uploads.resumable_threshold_bytes` is sent in chunks that the
 * server keeps as they arrive: a dropped connection is retried with back-off and carries on
 * from the server's offset, a paused upload resumes where it stopped, and after a page
 * reload the same file chosen again resumes too (tus-js-client remembers the upload URL in
 * localStorage under the file's fingerprint). The server commits the finished file exactly
 * like a multipart upload; this module only moves bytes and reports progress.
 *
 * tus-js-client is a classic script that defines `window.tus`; the page loads it before
 * the modules, and it is looked up only when the file manager starts.
 */
import { formatSize, problemOf, setCsrfHeaders, t } from "./common.js";

var CHUNK_SIZE = 8 * 1024 * 1024;
var RETRY_DELAYS = [0, 1000, 3000, 5000, 10000, 20000, 30000, 60000];
var RATE_WINDOW_MS = 5000;

function formatDuration(seconds) {
  var rounded = Math.max(1, Math.round(seconds));
  if (rounded < 60) {
    return t("seconds", { n: rounded });
  }
  if (rounded < 3600) {
    return t("minutes", { n: Math.round(rounded / 60) });
  }
  return t("hours", { n: (rounded / 3600).toFixed(1) });
}

/** Bytes per second over the last few seconds of progress. */
function RateMeter() {
  this.samples = [];
}
RateMeter.prototype.add = function (bytes) {
  var now = Date.now();
  this.samples.push([now, bytes]);
  while (this.samples.length > 2 && now - this.samples[0][0] > RATE_WINDOW_MS) {
    this.samples.shift();
  }
};
RateMeter.prototype.reset = function () {
  this.samples = [];
};
RateMeter.prototype.rate = function () {
  if (this.samples.length < 2) {
    return null;
  }
  var first = this.samples[0];
  var last = this.samples[this.samples.length - 1];
  var seconds = (last[0] - first[0]) / 1000;
  return seconds > 0 ? (last[1] - first[1]) / seconds : null;
};

/** What a person reads about a tus failure (no response at all: the connection). */
function problemOfUpload(error) {
  var response = error && error.originalResponse;
  if (!response) {
    return problemOf(0, null);
  }
  var body = null;
  try {
    body = JSON.parse(response.getBody());
  } catch (ignored) {
    body = null;
  }
  return problemOf(response.getStatus(), body);
}

/** tus-js-client's own rule (server errors, 409, 423, no response), shown in the row. */
function shouldRetry(error) {
  var response = error && error.originalResponse;
  var status = response ? response.getStatus() : 0;
  return (status < 400 || status === 409 || status === 423) && navigator.onLine !== false;
}

/** Add the transfer line and the pause button to a queued file's row. */
function decorate(entry) {
  var info = document.createElement("span");
  info.className = "transfer";
  info.setAttribute("aria-live", "off");
  var button = document.createElement("button");
  button.type = "button";
  button.className = "button pause";
  button.textContent = t("pause");
  button.hidden = true;
  entry.item.appendChild(info);
  entry.item.appendChild(button);
  entry.item.classList.add("resumable");
}

/**
 * Send one file. Resolves once the server has stored it; rejects with Error("cancelled")
 * after `entry.cancel()`, or with the server's explanation when retrying cannot help.
 */
function send(tus, endpoint, entry, onConflict, onProgress) {
  var info = entry.item.querySelector(".transfer");
  var button = entry.item.querySelector(".pause");
  var meter = new RateMeter();
  var paused = false;
  var settled = false;

  function show(sent, total) {
    var rate = meter.rate();
    var text = t("progressOf", { loaded: formatSize(sent), total: formatSize(total) });
    if (paused) {
      text += " · " + t("paused");
    } else if (rate && rate > 0) {
      text +=
        " · " +
        t("rate", { rate: formatSize(Math.round(rate)) }) +
        " · " +
        t("timeLeft", { time: formatDuration((total - sent) / rate) });
    }
    info.textContent = text;
  }

  return new Promise(function (resolve, reject) {
    var lastSent = 0;
    var upload = new tus.Upload(entry.file, {
      endpoint: endpoint,
      chunkSize: CHUNK_SIZE,
      retryDelays: RETRY_DELAYS,
      metadata: { filename: entry.file.name, on_conflict: onConflict },
      // Every request (creation, each PATCH, HEAD after a reload) carries the CSRF
      // headers as they are at that moment: the server may renew the cookie mid-upload.
      onBeforeRequest: function (request) {
        setCsrfHeaders(function (name, value) {
          request.setHeader(name, value);
        });
      },
      storeFingerprintForResuming: true,
      removeFingerprintOnSuccess: true,
      onShouldRetry: function (error) {
        var retry = shouldRetry(error);
        if (retry) {
          info.textContent = t("retrying");
        }
        return retry;
      },
      onProgress: function (sent, total) {
        lastSent = sent;
        meter.add(sent);
        show(sent, total);
        onProgress(sent);
      },
      onSuccess: function () {
        settled = true;
        button.hidden = true;
        onProgress(entry.file.size);
        show(entry.file.size, entry.file.size);
        resolve();
      },
      onError: function (error) {
        settled = true;
        button.hidden = true;
        reject(new Error(problemOfUpload(error)));
      },
    });

    button.hidden = false;
    button.onclick = function () {
      if (settled) {
        return;
      }
      paused = !paused;
      button.textContent = paused ? t("resume") : t("pause");
      entry.item.classList.toggle("paused", paused);
      if (paused) {
        upload.abort();
        show(lastSent, entry.file.size);
      } else {
        meter.reset();
        upload.start();
      }
    };
    entry.cancel = function () {
      settled = true;
      button.hidden = true;
      upload.abort(true).then(
        function () {
          reject(new Error("cancelled"));
        },
        function () {
          reject(new Error("cancelled"));
        }
      );
    };

    upload
      .findPreviousUploads()
      .then(function (previous) {
        if (previous.length) {
          upload.resumeFromPreviousUpload(previous[0]);
        }
        upload.start();
      })
      .catch(function () {
        upload.start();
      });
  });
}

/**
 * The file manager's resumable uploads, or null when the page or the browser cannot do them
 * (then every file goes through the multipart request).
 */
export function resumableUploads(root) {
  var tus = window.tus;
  if (!root || !tus || !tus.isSupported || !root.getAttribute("data-tus-url")) {
    return null;
  }
  var endpoint = root.getAttribute("data-tus-url");
  var threshold = parseInt(root.getAttribute("data-resumable-threshold"), 10) || Infinity;
  return {
    /** Whether a file goes through tus rather than the multipart request. */
    wants: function (file) {
      return file.size > threshold;
    },
    decorate: decorate,
    send: function (entry, onConflict, onProgress) {
      return send(tus, endpoint, entry, onConflict, onProgress);
    },
  };
}
