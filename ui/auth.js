// The access token. It arrives once as `?token=` on the page URL, is kept in sessionStorage
// (so it survives reloads of this tab but not the tab itself) and is taken out of the address
// bar, so it is not bookmarked or shared by accident.

const KEY = 'agentd.token';

/** The token of this page, when storage is refused. */
let memory = null;

function stored() {
  try {
    return sessionStorage.getItem(KEY);
  } catch {
    return null;
  }
}

/** Saves a token for this tab. */
export function storeToken(token) {
  try {
    if (token) sessionStorage.setItem(KEY, token);
    else sessionStorage.removeItem(KEY);
  } catch {
    // Storage refused (private mode): the token lives only in this page.
  }
  memory = token || null;
}

/** Reads `?token=` off the page URL (removing it) or the token this tab kept. */
export function takeToken() {
  const url = new URL(window.location.href);
  const given = url.searchParams.get('token');
  if (given !== null) {
    storeToken(given);
    url.searchParams.delete('token');
    window.history.replaceState(window.history.state, '', url);
  }
  return memory ?? stored();
}

/** The current token, or null when none was given. */
export function token() {
  return memory ?? stored();
}
