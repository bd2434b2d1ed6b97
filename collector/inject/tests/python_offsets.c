/* Prints the CPython struct offsets gpucollect-inject reads (src/python.rs, `Layout`), one
 * "field value" line each, as compiled against an interpreter's own headers (internal ones
 * included). Built and compared by the `layouts_match_the_installed_headers` unit test:
 *   gcc -I$INC -I$INC/internal python_offsets.c && ./a.out */
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include "internal/pycore_code.h"
#include "internal/pycore_frame.h"

#define P(name, v) printf("%s %zu\n", name, (size_t)(v))

int main(void) {
    P("minor", PY_MINOR_VERSION);
#if PY_VERSION_HEX < 0x030D0000
    P("tstate_cframe", offsetof(PyThreadState, cframe));
    P("current_frame", offsetof(_PyCFrame, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_code));
    P("frame_instr", offsetof(_PyInterpreterFrame, prev_instr));
#else
    P("current_frame", offsetof(PyThreadState, current_frame));
    P("frame_code", offsetof(_PyInterpreterFrame, f_executable));
    P("frame_instr", offsetof(_PyInterpreterFrame, instr_ptr));
#endif
    P("frame_previous", offsetof(_PyInterpreterFrame, previous));
    P("frame_owner", offsetof(_PyInterpreterFrame, owner));
#if PY_VERSION_HEX < 0x030C0000
    P("frame_is_entry", offsetof(_PyInterpreterFrame, is_entry));
#else
    P("owner_cstack", FRAME_OWNED_BY_CSTACK);
#endif
    P("code_units", offsetof(PyVarObject, ob_size));
    P("code_filename", offsetof(PyCodeObject, co_filename));
    P("code_qualname", offsetof(PyCodeObject, co_qualname));
    P("code_linetable", offsetof(PyCodeObject, co_linetable));
    P("code_firstlineno", offsetof(PyCodeObject, co_firstlineno));
#if PY_VERSION_HEX < 0x030D0000
    P("code_firsttraceable", offsetof(PyCodeObject, _co_firsttraceable));
#endif
    P("code_adaptive", offsetof(PyCodeObject, co_code_adaptive));
    P("bytes_size", offsetof(PyVarObject, ob_size));
    P("bytes_sval", offsetof(PyBytesObject, ob_sval));
    P("str_length", offsetof(PyASCIIObject, length));
    P("str_state", offsetof(PyASCIIObject, state));
    P("str_ascii_size", sizeof(PyASCIIObject));
    P("str_compact_size", sizeof(PyCompactUnicodeObject));
    P("str_basicsize", sizeof(PyUnicodeObject));
    P("ob_type", offsetof(PyObject, ob_type));
    /* The state bits python.rs decodes. */
    PyASCIIObject a;
    unsigned int w;
    memset(&a, 0, sizeof a);
    a.state.kind = 7;
    memcpy(&w, &a.state, sizeof w);
    P("state_kind_mask", w);
    memset(&a, 0, sizeof a);
    a.state.compact = 1;
    memcpy(&w, &a.state, sizeof w);
    P("state_compact", w);
    memset(&a, 0, sizeof a);
    a.state.ascii = 1;
    memcpy(&w, &a.state, sizeof w);
    P("state_ascii", w);
    return 0;
}
