/* dsc/api.h — DSC_API, the mark of every function libdsc exports.
 *
 * libdsc is built with hidden visibility: only declarations marked DSC_API
 * in the installed headers (include/dsc/) are exported; everything else,
 * the backend and op tables included, stays inside the library.
 * tests/install/check_exports.sh fails when the library exports a symbol no
 * installed header declares. */
#ifndef DSC_API_H
#define DSC_API_H

#define DSC_API __attribute__((visibility("default")))

#endif
