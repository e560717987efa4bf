/* What crane's dom0 service uses from libxl: contexts, domain lookup and
 * information, PCI passthrough, domain destruction, the logger interface and
 * vsnprintf (to format the va_list libxl hands the logger). */
#include <stdio.h>
#include <libxl.h>
#include <libxl_utils.h>
