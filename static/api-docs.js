// Starts Swagger UI on the API docs page. It lives in a file because the pages' CSP allows
// no inline script; the document's URL comes from the page.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("swagger-ui");
  if (!root || typeof window.SwaggerUIBundle !== "function") {
    return;
  }
  window.SwaggerUIBundle({
    url: root.dataset.specUrl,
    domNode: root,
    deepLinking: true,
    validatorUrl: null, // never send the document to an outside validator
    tryItOutEnabled: false,
    presets: [window.SwaggerUIBundle.presets.apis],
  });
});
