/* Starts Swagger UI on the API docs page. It lives in a file because the pages' CSP allows
 * no inline script; the document's URL comes from the page. "Try it out" requests are
 * made by the signed-in page, so they carry the same CSRF headers as the file manager's.
 */
import { csrfHeaders } from "./common.js";

function start() {
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
    requestInterceptor: (request) => {
      Object.assign(request.headers, csrfHeaders());
      return request;
    },
  });
}

// A module runs after the deferred Swagger UI bundle and before DOMContentLoaded.
start();
